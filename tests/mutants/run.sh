#!/usr/bin/env bash
# Applies each mutant of tests/mutants/mutants.tsv in turn (one literal change to one source file),
# rebuilds, runs the ctest tests it names and restores the file: a mutant that every one of those
# tests passes has survived. Prints a table (mutant, the tests that killed it) and exits 1 if any
# survived, 2 if one could not be applied or built.
#
#   tests/mutants/run.sh [--build DIR] [ID ...]   (default: build/, a configured Release build; all mutants)
#
# The source files are restored on any exit, and the build is brought back to the clean tree at the end.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$repo_root/build"
if [[ ${1:-} == --build ]]; then
  build=$2
  shift 2
fi
wanted=("$@")
[[ -f $build/CTestTestfile.cmake ]] || { echo "run.sh: $build is not a configured build (scripts/build.sh first)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

saved=$(mktemp -d)
current=""
restore() {
  if [[ -n $current ]]; then
    cp -p "$saved/original" "$repo_root/$current"
    touch "$repo_root/$current"  # newer than the mutant's object file, so it is rebuilt
  fi
  current=""
}
trap 'restore; rm -rf "$saved"' EXIT

# mutate FILE TEXT REPLACEMENT: the one occurrence of TEXT in FILE replaced (\n in either is a newline).
mutate() {
  FROM=$2 TO=$3 perl -0777 -i -pe '
    BEGIN { ($f, $t) = ($ENV{FROM}, $ENV{TO}); s/\\n/\n/g for ($f, $t) }
    my $n = () = /\Q$f\E/g;
    die "the text occurs $n times, not once\n" unless $n == 1;
    s/\Q$f\E/$t/;' "$1"
}

results=() survived=0 broken=0 began=$(date +%s)
# The list comes in on fd 3: mpirun, under ctest, forwards standard input to rank 0 and would eat it.
while IFS=$'\t' read -r id file from to tests <&3; do
  [[ -z $id || $id == \#* ]] && continue
  if ((${#wanted[@]} > 0)) && [[ " ${wanted[*]} " != *" $id "* ]]; then continue; fi
  echo "== $id: $file =="
  # A pattern that names no test would let every mutant survive unseen: the entry is broken.
  if [[ $(ctest --test-dir "$build" -N -R "$tests" | sed -n 's/^Total Tests: //p') == 0 ]]; then
    results+=("$(printf '%-42s %s' "$id" "NOT RUN: no ctest test matches $tests")")
    broken=$((broken + 1))
    continue
  fi
  cp -p "$repo_root/$file" "$saved/original"
  current=$file
  if ! mutate "$repo_root/$file" "$from" "$to"; then
    results+=("$(printf '%-42s %s' "$id" "NOT APPLIED: the text is not in $file once")")
    broken=$((broken + 1))
    restore
    continue
  fi
  if ! cmake --build "$build" -j "${DPTRAIN_JOBS:-2}" >"$saved/build.log" 2>&1; then
    tail -5 "$saved/build.log"
    results+=("$(printf '%-42s %s' "$id" "NOT BUILT (a mutant must compile)")")
    broken=$((broken + 1))
    restore
    continue
  fi
  started=$(date +%s)
  if ctest --test-dir "$build" -R "$tests" -j "${DPTRAIN_JOBS:-2}" >"$saved/ctest.log" 2>&1 </dev/null; then
    verdict="SURVIVED ($( (grep -o '[0-9]* tests passed\|out of [0-9]*' "$saved/ctest.log" || true) | tail -1 | tr -d '\n') passed: $tests)"
    survived=$((survived + 1))
  else
    failed=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (\(Failed\|Timeout\|SEGFAULT\|Subprocess aborted\|Exception\).*/\1/p' "$saved/ctest.log" | tr '\n' ' ')
    verdict="killed by ${failed:-(see ctest log)}"
  fi
  results+=("$(printf '%-42s %s  [%d s]' "$id" "$verdict" $(($(date +%s) - started)))")
  echo "   ${results[-1]}"
  restore
done 3<"$repo_root/tests/mutants/mutants.tsv"

echo "== rebuilding the clean tree =="
cmake --build "$build" -j "${DPTRAIN_JOBS:-2}" >/dev/null
echo "== mutants ($(($(date +%s) - began)) s) =="
printf '  %s\n' "${results[@]}"
((broken == 0)) || exit 2
((survived == 0)) || exit 1
