#!/usr/bin/env bash
# What distributed.deterministic costs: train_bench samples/s with the mode off and on, run
# interleaved (off, on, off, on, ...) so that drifting machine noise hits both alike, for the MNIST
# CNN and MLP at np 1 (1 and 2 threads) and np 2 (1 thread per rank), batch 128 per rank, with
# micro-batches of 32 (the default: 4 per rank and step) and of 128 (one: the fixed-point sum
# alone). Prints the median of each and on / off. A CNN step takes ~30 ms and an MLP step ~1 ms, so
# the MLP runs 10x the steps: a timing window of a few ms would measure the machine's noise.
#
#   bench/deterministic_cost.sh [--runs 3] [--steps 40] [--configs "mnist.json mnist_mlp.json"] [BUILD]
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=3 steps=40 configs="mnist.json mnist_mlp.json"
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    *) echo "deterministic_cost.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
build="${1:-$repo_root/build}"
bench="$build/bench/train_bench"
[[ -x "$bench" ]] || { echo "deterministic_cost.sh: $bench is not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# measure NP THREADS CONFIG [--set ...]: global samples/s, the median of 3 repetitions.
measure() {
  local np=$1 threads=$2 config=$3 config_steps=$steps
  shift 3
  [[ "$config" == *mlp* ]] && config_steps=$((steps * 10))
  local cmd=("$bench" --config "$repo_root/configs/$config" --threads "$threads" --steps "$config_steps" --reps 3
             --warmup 10 --set "data.dir=\"$repo_root/data/mnist\"" "$@")
  [[ "$np" -gt 1 ]] && cmd=(mpirun -np "$np" --bind-to core "${cmd[@]}")
  (cd "$repo_root" && "${cmd[@]}") | sed -n 's/.*median \([0-9.]*\) samples\/s.*/\1/p' | head -1
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPU(s) for this process"
printf '%-16s %-3s %-7s %10s %12s %12s %9s %9s\n' config np threads off "on, micro 32" "on, 128" "32/off" "128/off"
for config in $configs; do
  for setting in "1 1" "1 2" "2 1"; do
    read -r np threads <<<"$setting"
    off="" on32="" on128=""
    for ((i = 0; i < runs; ++i)); do
      off+="$(measure "$np" "$threads" "$config") "
      on32+="$(measure "$np" "$threads" "$config" --set distributed.deterministic=true) "
      on128+="$(measure "$np" "$threads" "$config" --set distributed.deterministic=true \
        --set distributed.deterministic_micro_batch=128) "
    done
    m=()
    for list in "$off" "$on32" "$on128"; do m+=("$(echo "$list" | tr ' ' '\n' | grep . | median)"); done
    awk -v c="$config" -v np="$np" -v t="$threads" -v a="${m[0]}" -v b="${m[1]}" -v d="${m[2]}" \
      'BEGIN { printf "%-16s %-3s %-7s %10.0f %12.0f %12.0f %9.3f %9.3f\n", c, np, t, a, b, d, b / a, d / a }'
    echo "    runs off: $off| micro 32: $on32| micro 128: $on128" >&2
  done
done
