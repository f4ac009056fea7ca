#!/usr/bin/env bash
# Installs what is missing, builds and runs every test through ctest, twice: a Release build (the
# code users run) and an AddressSanitizer + UBSan build (memory errors and undefined behaviour);
# then fuzzes each file reader for DPTRAIN_FUZZ_SECONDS (default 20) with libFuzzer (scripts/fuzz.sh).
#   scripts/test.sh [--no-sanitize] [--no-fuzz]      DPTRAIN_JOBS=N sets build parallelism (default 2)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
sanitize=1 fuzz=1
for arg in "$@"; do
  case "$arg" in
    --no-sanitize) sanitize=0 ;;
    --no-fuzz) fuzz=0 ;;
    *) echo "test.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done
# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
setup_args=()
[[ $fuzz == 1 ]] && setup_args+=(--with-fuzz)
scripts/setup.sh "${setup_args[@]}"
start=$(date +%s)
echo "== Release build and tests =="
scripts/build.sh build
ctest --test-dir build --output-on-failure -j "${DPTRAIN_JOBS:-2}"
if [[ $sanitize == 1 ]]; then
  echo "== AddressSanitizer + UBSan build and tests =="
  scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPTRAIN_SANITIZE=ON
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "${DPTRAIN_JOBS:-2}"
fi
if [[ $fuzz == 1 ]]; then
  echo "== libFuzzer, ASan + UBSan: ${DPTRAIN_FUZZ_SECONDS:-20} s per reader =="
  scripts/fuzz.sh --seconds "${DPTRAIN_FUZZ_SECONDS:-20}"
fi
echo "== all tests passed in $(( $(date +%s) - start )) s =="
