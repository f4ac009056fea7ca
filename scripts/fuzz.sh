#!/usr/bin/env bash
# Fuzzes the readers of outside files (tests/fuzz: config, idx, npy, image, cifar, checkpoint) with libFuzzer under
# AddressSanitizer and UBSan, each for a bounded time, starting from its seed corpus and its kept
# crash inputs. Builds them first with clang in --build: a -DDPTRAIN_FUZZ=ON build of core/, optim/,
# data/ and distributed/ (coverage everywhere), or, where --build is a clang sanitizer build such as
# scripts/test.sh's build-asan, the targets beside its tests (coverage in the readers only).
#
#   scripts/fuzz.sh [--seconds 30 | --runs N] [--targets "config idx npy image cifar checkpoint"] [--build build-fuzz]
#
# --runs N fuzzes each target for N executions instead of a time (e.g. 10000000 for a long run).
# The corpus grows in BUILD/corpus/<target> (the checked-in seeds are never written). A crash leaves
# its input in BUILD/crashes/<target>/ and the script exits 1; fix the bug, then keep the input as a
# regression: cp it to tests/fuzz/regressions/<target>/, where every ctest run replays it.
# Needs clang, libclang-rt-14-dev and libomp-14-dev (scripts/setup.sh --with-fuzz).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=30 runs="" targets="config idx npy image cifar checkpoint" build="$repo_root/build-fuzz"
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2 ;;
    --runs) runs=$2 ;;
    --targets) targets=$2 ;;
    --build) build=$2 ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
  shift 2
done
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (scripts/setup.sh --with-fuzz)" >&2; exit 1; }

if grep -q '^DPTRAIN_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  # A sanitizer build (scripts/test.sh's build-asan) has the fuzz targets beside its tests when clang
  # compiled it.
  grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' "$build/CMakeCache.txt" ||
    { echo "fuzz.sh: $build is a sanitizer build compiled by GCC; fuzz targets need clang (-DCMAKE_CXX_COMPILER=clang++)" >&2; exit 1; }
else
  cmake -S "$repo_root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DDPTRAIN_FUZZ=ON -DDPTRAIN_CUDA=OFF -DDPTRAIN_BUILD_TESTS=OFF >/dev/null
fi
# shellcheck disable=SC2086  # word splitting of the target list is wanted
cmake --build "$build" -j "${DPTRAIN_JOBS:-2}" --target $(printf 'fuzz_%s ' $targets)

budget=(-max_total_time="$seconds") what="${seconds} s"
[ -n "$runs" ] && budget=(-runs="$runs") what="$runs executions"
failed=0
for target in $targets; do
  corpus="$build/corpus/$target" crashes="$build/crashes/$target"
  mkdir -p "$corpus" "$crashes"
  seeds=("$repo_root/tests/fuzz/corpus/$target")
  [ -d "$repo_root/tests/fuzz/regressions/$target" ] && seeds+=("$repo_root/tests/fuzz/regressions/$target")
  dict=()
  [ -f "$repo_root/tests/fuzz/$target.dict" ] && dict=(-dict="$repo_root/tests/fuzz/$target.dict")
  echo "== fuzz_$target: $what (corpus $corpus) =="
  # -rss_limit_mb / -malloc_limit_mb: a header that makes the reader allocate gigabytes is a finding.
  if ! "$build/tests/fuzz/fuzz_$target" "$corpus" "${seeds[@]}" "${dict[@]}" "${budget[@]}" \
      -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
      -artifact_prefix="$crashes/" >"$build/fuzz_$target.log" 2>&1; then
    tail -40 "$build/fuzz_$target.log"
    echo "fuzz_$target FAILED: input(s) in $crashes; fix, then keep each in tests/fuzz/regressions/$target/"
    failed=1
    continue
  fi
  grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" "$build/fuzz_$target.log" | tr '\n' ' '
  echo "corpus: $(find "$corpus" -type f | wc -l) inputs"
done
exit $failed
