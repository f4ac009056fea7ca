#!/usr/bin/env bash
# What distributed.shard_optimizer (ZeRO-1) buys: ResNet-50 on synthetic 3x64x64 images with Adam,
# np 2, the trainer run with the optimizer sharded and not, interleaved (off, on, off, on, ...) so
# that drifting machine noise hits both alike. From each run's metrics.jsonl: samples/s, the step's
# optimizer and communication phases, the optimizer state per rank and the largest rank's peak RSS
# (read before the run's checkpoint, which gathers a sharded state whole for a moment). Prints
# every run, then the medians and sharded / unsharded.
#
#   bench/shard_optimizer.sh [--runs 3] [--steps 12] [--np 2] [--batch 16] [BUILD]
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=3 steps=12 np=2 batch=16
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --np) np="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    *) echo "shard_optimizer.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
build="${1:-$repo_root/build}"
trainer="$build/trainer"
check="$build/tests/e2e_check"
[[ -x "$trainer" && -x "$check" ]] || { echo "shard_optimizer.sh: $trainer or $check is not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cat >"$scratch/resnet50.json" <<JSON
{
  "seed": 42,
  "data": {"dataset": "synthetic", "batch_size": $batch,
           "synthetic": {"samples": $((batch * np * (steps + 1))), "test_samples": $np}},
  "model": {"architecture": "resnet50", "num_classes": 1000, "input_shape": [3, 64, 64]},
  "optimizer": {"type": "adam", "lr": 0.001},
  "training": {"epochs": 1, "max_steps": $steps, "progress": "off"}
}
JSON
echo "ResNet-50, synthetic 3x64x64, Adam, batch $batch per rank, np $np, $steps steps, $runs interleaved round(s)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) CPU(s)"
printf '%-9s %4s %12s %14s %18s %16s %14s\n' mode run samples/s "optimizer ms" "communication ms" "state/rank MB" "peak RSS MB"
declare -A values
for ((run = 1; run <= runs; ++run)); do
  for shard in false true; do
    out="$scratch/$shard-$run"
    mpirun -np "$np" --oversubscribe "$trainer" --config "$scratch/resnet50.json" --set threads=1 \
      --set "output_dir=\"$out\"" --set distributed.shard_optimizer=$shard >"$out.log" 2>&1 ||
      { tail -5 "$out.log"; exit 1; }
    metric() { "$check" metric "$out/metrics.jsonl" "$1"; }
    steps_json=$(metric step_ms)
    field() { echo "$steps_json" | sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p"; }
    row=("$(metric samples_per_sec)" "$(field optimizer)" "$(field communication)"
         "$(awk -v b="$(metric optimizer_state_bytes_per_rank)" 'BEGIN { print b / 1e6 }')"
         "$(awk -v b="$(metric peak_resident_bytes)" 'BEGIN { print b / 1e6 }')")
    for k in 0 1 2 3 4; do values[$shard,$k]+="${row[$k]} "; done
    printf '%-9s %4d %12.2f %14.2f %18.2f %16.1f %14.1f\n' "$([ $shard = true ] && echo sharded || echo whole)" \
      "$run" "${row[@]}"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "medians (sharded / whole):"
names=("samples/s" "optimizer ms per step" "communication ms per step" "optimizer state MB per rank" "peak RSS MB (largest rank)")
for k in 0 1 2 3 4; do
  whole=$(echo "${values[false,$k]}" | median)
  sharded=$(echo "${values[true,$k]}" | median)
  printf '  %-28s whole %10.2f  sharded %10.2f  ratio %.3f\n' "${names[$k]}" "$whole" "$sharded" \
    "$(awk -v a="$sharded" -v b="$whole" 'BEGIN { print a / b }')"
done
