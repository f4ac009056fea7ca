#!/usr/bin/env bash
# Two builds of dptrain, run interleaved (A, B, A, B, ...) on the same core so that drifting machine
# noise hits both alike: train_bench samples/s for each config, the median of each, and B / A.
# For "did this change cost speed": build the old commit beside the new one (git worktree) and
# compare.
#
#   bench/compare_builds.sh [--runs 5] [--steps 100] [--core 1] BUILD_A BUILD_B [CONFIG ...]
#
# CONFIGs default to configs/mnist.json and configs/mnist_mlp.json (one thread, their batch of 128).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=5 steps=100 core=1
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --core) core="$2"; shift 2 ;;
    *) echo "compare_builds.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ $# -ge 2 ]] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
a="$1" b="$2"
shift 2
configs=("$@")
((${#configs[@]})) || configs=("$repo_root/configs/mnist.json" "$repo_root/configs/mnist_mlp.json")
for build in "$a" "$b"; do
  [[ -x "$build/bench/train_bench" ]] || { echo "compare_builds.sh: $build/bench/train_bench is not built" >&2; exit 1; }
done

# samples/s of one run (the median of its 3 repetitions).
measure() {
  (cd "$repo_root" && taskset -c "$core" "$1/bench/train_bench" --config "$2" --threads 1 --steps "$steps" --reps 3 \
     --warmup 20) | sed -n 's/.*median \([0-9.]*\) samples\/s.*/\1/p'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPU(s) for this process"
printf '%-22s %-40s %s\n' config "A: $a" "B: $b"
for config in "${configs[@]}"; do
  list_a="" list_b=""
  for ((i = 0; i < runs; ++i)); do
    list_a+="$(measure "$a" "$config") "
    list_b+="$(measure "$b" "$config") "
  done
  ma=$(echo "$list_a" | tr ' ' '\n' | grep . | median)
  mb=$(echo "$list_b" | tr ' ' '\n' | grep . | median)
  printf '%-22s A runs: %s\n%-22s B runs: %s\n' "$(basename "$config")" "$list_a" "" "$list_b"
  awk -v a="$ma" -v b="$mb" -v c="$(basename "$config")" \
    'BEGIN { printf "%-22s median A %.0f, median B %.0f samples/s: B / A = %.3f\n", c, a, b, b / a }'
done
