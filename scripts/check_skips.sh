#!/usr/bin/env bash
# Fails when a ctest run skipped anything that tests/expected_skips.txt does not allow on this
# machine: ctest prints "100% tests passed" over skipped tests, and GoogleTest's skips inside one
# ctest entry (distributed_np2 under mpirun, backend_conformance) do not reach ctest at all.
#
#   scripts/check_skips.sh BUILD/ctest-junit.xml   (written by ctest --output-junit, as scripts/test.sh does)
#
# Lists every skip with its verdict; exit 1 if any is unexpected, 2 if the file cannot be read.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
junit=${1:?usage: check_skips.sh BUILD/ctest-junit.xml}
[ -s "$junit" ] || { echo "check_skips: $junit is missing or empty (run ctest with --output-junit)" >&2; exit 2; }

# What this machine is, for the WHEN column.
conditions=(always)
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  conditions+=(gpu)
else
  conditions+=(no-gpu)
fi
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null || conditions+=(no-torch)

# Skipped entries: a <testcase status="notrun"> is a skipped ctest entry; inside a test that ran,
# each "[  SKIPPED ] Suite.Test (N ms)" line (one per rank under mpirun) is a skip within it.
mapfile -t skipped < <(awk '
  /<testcase / {
    match($0, /name="[^"]*"/); name = substr($0, RSTART + 6, RLENGTH - 7)
    notrun = ($0 ~ /status="notrun"/)
    if (notrun) print name
  }
  !notrun && /^\[  SKIPPED \] [A-Za-z0-9_\/.]+ \([0-9]+ ms\)/ { print name "/" $4 }
' "$junit" | sort -u)

mapfile -t rules < <(grep -v '^[[:space:]]*\(#\|$\)' "$repo_root/tests/expected_skips.txt")
unexpected=0
for entry in "${skipped[@]}"; do
  verdict="UNEXPECTED"
  for rule in "${rules[@]}"; do
    read -r when pattern <<<"$rule"
    [[ " ${conditions[*]} " == *" $when "* ]] || continue
    if [[ "$entry" =~ $pattern ]]; then verdict="expected ($when)"; break; fi
  done
  [[ $verdict == UNEXPECTED ]] && unexpected=$((unexpected + 1))
  printf '  skipped %-90s %s\n' "$entry" "$verdict"
done
echo "check_skips: ${#skipped[@]} skip(s) in $junit on this machine (${conditions[*]}), $unexpected unexpected"
if ((unexpected > 0)); then
  echo "check_skips: a skip not listed in tests/expected_skips.txt for this machine is a failure" >&2
  exit 1
fi
