#!/usr/bin/env bash
# Installs what is missing, builds and runs every test through ctest, twice: a Release build (the
# code users run, CUDA compiled where the toolkit is) and an AddressSanitizer + UBSan build with clang
# (memory errors and undefined behaviour; no CUDA, end-to-end cases at their smallest size through
# DPTRAIN_E2E_SMALL, accuracy and benchmark-shaped cases left to Release); then fuzzes each file
# reader for DPTRAIN_FUZZ_SECONDS (default 5) with libFuzzer (scripts/fuzz.sh), with the fuzz targets
# of the sanitizer build (of a build of their own under --no-sanitize). After each ctest,
# scripts/check_skips.sh fails the run on any skip that tests/expected_skips.txt does not allow on
# this machine. Ends with the time of each stage.
#   scripts/test.sh [--no-sanitize] [--no-fuzz] [--with-torch]   DPTRAIN_JOBS=N: build jobs (2), ctest slots N+2
# --with-torch installs PyTorch (python3-torch, torchvision) so that the interop tests run too.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
sanitize=1 fuzz=1 torch=0
for arg in "$@"; do
  case "$arg" in
    --no-sanitize) sanitize=0 ;;
    --no-fuzz) fuzz=0 ;;
    --with-torch) torch=1 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown option '$arg' (--help lists them)" >&2; exit 2 ;;
  esac
done
# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=${DPTRAIN_JOBS:-2}

# stage NAME COMMAND...: runs COMMAND, adding "NAME seconds" to the table printed at exit.
stage_table=() start=$(date +%s)
stage() {
  local name=$1 began
  shift
  began=$(date +%s)
  echo "== $name =="
  if "$@"; then
    stage_table+=("$(printf '%-34s %6d s' "$name" $(($(date +%s) - began)))")
  else
    local rc=$?
    stage_table+=("$(printf '%-34s %6d s  FAILED (exit %d)' "$name" $(($(date +%s) - began)) "$rc")")
    return "$rc"
  fi
}
print_stages() {
  echo "== stage times =="
  printf '  %s\n' "${stage_table[@]}"
  printf '  %-34s %6d s\n' "total" $(($(date +%s) - start))
}
# Open MPI 4 removes its top session directory (ompi.<host>.<uid> in the temporary directory) when
# the last job in it ends, and a job starting at that moment can fail: "mkdir /tmp/ompi.vm.0 ... File
# exists" (open-mpi/ompi#8510; once in about ten CI runs here, where ctest starts several MPI jobs at
# once). A directory of ours inside it keeps it in place while the tests run: Open MPI's clean-up
# deletes the files it finds there, not directories.
ompi_top_dir="${TMPDIR:-${TEMP:-${TMP:-/tmp}}}/ompi.$(uname -n | cut -d. -f1).$(id -u)"
ompi_keep_dir="$ompi_top_dir/dptrain-test.$$"
mkdir -p "$ompi_keep_dir"
on_exit() {
  rmdir "$ompi_keep_dir" "$ompi_top_dir" 2>/dev/null || true
  print_stages
}
trap on_exit EXIT

# run_ctest BUILD_DIR [ctest args]: every test of the build, then the skip check on its results.
run_ctest() {
  local dir=$1
  shift
  # Passed tests' output in full in the JUnit file: skips inside one ctest entry (GoogleTest's
  # "[  SKIPPED ]" under mpirun) are read from there.
  # (--output-junit takes a path relative to the test directory.)
  # Two slots more than jobs: an end-to-end case takes two (tests/CMakeLists.txt) and keeps two cores
  # only half busy, so two cases run side by side, or one beside two single-process tests (the
  # sanitizer build's end-to-end cases on 2 cores: 346 s with 3 slots, 282 s with 4).
  ctest --test-dir "$dir" --output-on-failure -j "$((jobs + 2))" --output-junit ctest-junit.xml \
    --test-output-size-passed 1048576 "$@"
}

run_sanitized_ctest() (
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  run_ctest build-asan
)

# Slurm and munge for the Slurm test (tests/scripts/slurm_e2e.sh, scripts/slurm_local.sh).
setup_args=(--with-slurm)
# --with-fuzz: clang and its sanitizer runtimes, for the sanitizer build and for the fuzzers.
[[ $sanitize == 1 || $fuzz == 1 ]] && setup_args+=(--with-fuzz)
[[ $torch == 1 ]] && setup_args+=(--with-torch)
stage "set-up (scripts/setup.sh)" scripts/setup.sh "${setup_args[@]}"

# CUDA AUTO: a build/ that scripts/quickstart.sh configured without it compiles it now.
stage "Release build" scripts/build.sh build -DDPTRAIN_CUDA=AUTO
stage "Release ctest" run_ctest build
stage "Release skip check" scripts/check_skips.sh build/ctest-junit.xml

if [[ $sanitize == 1 ]]; then
  # CUDA is left out: it runs nowhere here, and the Release build already compiles it with -Werror;
  # so is bench/, whose programs only the Release build's experiment-script tests drive. clang, not
  # GCC: on 2 cores it builds this in 330 s against GCC's 530, and the same build gives libFuzzer's
  # targets. A build-asan that GCC configured is started afresh (CMake cannot switch compilers).
  if [[ -f build-asan/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  stage "ASan+UBSan build (clang)" scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPTRAIN_SANITIZE=ON \
    -DDPTRAIN_CUDA=OFF -DDPTRAIN_BUILD_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  stage "ASan+UBSan ctest" run_sanitized_ctest
  stage "ASan+UBSan skip check" scripts/check_skips.sh build-asan/ctest-junit.xml
fi
if [[ $fuzz == 1 ]]; then
  fuzz_build=build-fuzz
  [[ $sanitize == 1 ]] && fuzz_build=build-asan
  stage "libFuzzer ${DPTRAIN_FUZZ_SECONDS:-5} s per reader" scripts/fuzz.sh --seconds "${DPTRAIN_FUZZ_SECONDS:-5}" \
    --build "$fuzz_build"
fi
echo "== all tests passed in $(($(date +%s) - start)) s =="
