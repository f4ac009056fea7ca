#!/usr/bin/env bash
# Training throughput on one core at batch 128, ours against PyTorch on the same model, in one run:
# idle, and with the other core streaming memory. Rounds are interleaved (round 1 of every condition
# and program, then round 2, ...) and the figures are medians over them.
#
#   bench/train_vs_pytorch.sh [--build build] [--rounds 3] [--models "cnn mlp"] [--conditions "idle loaded"]
#
# Every measured program runs pinned to core 0, one thread. "loaded": `machine_probe load` (copies of
# two 256 MiB buffers into each other) pinned to the last core meanwhile, a neighbour that streams
# memory as on a shared node or a busy VM (on a machine with SMT, check that the last core is not
# core 0's sibling: `lscpu -e`). Ours: build/bench/train_bench (the trainer's step on the
# config's data). PyTorch: ../shared/anchors/torch_cnn.py (same CNN / MLP, Adam, batch 128), as
# shipped and with the anchor's "tuned" malloc settings (freed memory kept instead of returned to the
# OS; our storage cache does the equivalent). Also printed: this core's memcpy bandwidth and an
# Eigen GEMM's FLOP/s (`machine_probe memcpy`, `machine_probe gemm`), and our step's FLOP/s as a
# fraction of that GEMM's (the compute limit). Results per run go to --out (runs.tsv).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/tuned_malloc.sh
source "$repo_root/bench/tuned_malloc.sh"
build=$repo_root/build rounds=3 models="cnn mlp" conditions="idle loaded" out=$repo_root/runs/train_vs_pytorch
while [ $# -gt 0 ]; do
  [[ $1 == -h || $1 == --help || $# -ge 2 ]] || { echo "train_vs_pytorch: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --build) build=$2 ;;
    --rounds) rounds=$2 ;;
    --models) models=$2 ;;
    --conditions) conditions=$2 ;;
    --out) out=$2 ;;
    -h | --help) sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train_vs_pytorch: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift 2
done
for condition in $conditions; do
  [[ $condition == idle || $condition == loaded ]] || { echo "train_vs_pytorch: unknown condition '$condition' (idle, loaded)" >&2; exit 2; }
done
for model in $models; do
  [[ $model == cnn || $model == mlp ]] || { echo "train_vs_pytorch: unknown model '$model' (cnn, mlp)" >&2; exit 2; }
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "train_vs_pytorch: --rounds must be a positive integer" >&2; exit 2; }
anchors="$repo_root/../shared/anchors"
bench="$build/bench/train_bench" probe="$build/bench/machine_probe"
for program in "$bench" "$probe"; do
  [[ -x "$program" ]] || { echo "train_vs_pytorch: $program not built (cmake --build $build)" >&2; exit 1; }
done
mkdir -p "$out"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPU(s) for this process"
last_core=$(($(nproc) - 1))
[[ $conditions != *loaded* || $last_core -gt 0 ]] || { echo "train_vs_pytorch: 'loaded' needs a second core" >&2; exit 1; }

have_torch=0
if [[ -f "$anchors/torch_cnn.py" ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null \
   && [[ -d /usr/share/datasets/fashion-mnist ]]; then
  have_torch=1
else
  echo "PyTorch comparison skipped: needs /usr/bin/python3 with torch (python3-torch), dataset-fashion-mnist and $anchors"
fi

# The JSON after "RESULT " on stdin, one key printed (a number, or a dict's median).
result() {
  sed -n 's/^RESULT //p' | /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); v=r[sys.argv[1]]; print(v["median"] if isinstance(v, dict) else v)' "$1"
}

taskset -c 0 "$probe" memcpy | tee "$out/memcpy.txt" | grep -v RESULT
gemm_gflops=$(taskset -c 0 "$probe" gemm --size 1024 | tee "$out/gemm.txt" | result gemm_gflop_per_s)
grep -v RESULT "$out/gemm.txt"

load_pid=""
stop_load() { [[ -z $load_pid ]] || { kill -TERM "$load_pid" 2>/dev/null || true; wait "$load_pid" || true; load_pid=""; }; }
trap stop_load EXIT

printf 'round\tcondition\tmodel\tprogram\tsamples_per_sec\tflops_per_sample\n' >"$out/runs.tsv"
for ((round = 1; round <= rounds; round++)); do
  for condition in $conditions; do
    if [[ $condition == loaded ]]; then
      taskset -c "$last_core" "$probe" load --mib 256 >"$out/load.txt" &
      load_pid=$!
      for _ in $(seq 600); do grep -q '^load: streaming' "$out/load.txt" && break; sleep 0.05; done
      grep -q '^load: streaming' "$out/load.txt" || { echo "train_vs_pytorch: the memory load did not start" >&2; exit 1; }
    fi
    for model in $models; do
      config="$repo_root/configs/mnist.json" steps=100
      [[ $model == mlp ]] && { config="$repo_root/configs/mnist_mlp.json"; steps=1000; }
      ours=$(cd "$repo_root" && taskset -c 0 "$bench" --config "$config" --threads 1 --steps "$steps" --reps 5)
      printf '%s\t%s\t%s\tours\t%s\t%s\n' "$round" "$condition" "$model" "$(result samples_per_sec <<<"$ours")" \
        "$(result training_flops_per_sample <<<"$ours")" >>"$out/runs.tsv"
      if [[ $have_torch == 1 ]]; then
        torch=$(taskset -c 0 /usr/bin/python3 "$anchors/torch_cnn.py" --model "$model" --threads 1 --steps "$steps" --reps 5 |
          result samples_per_s)
        tuned=$(env "${TUNED_MALLOC[@]}" taskset -c 0 \
          /usr/bin/python3 "$anchors/torch_cnn.py" --model "$model" --threads 1 --steps "$steps" --reps 5 |
          result samples_per_s)
        printf '%s\t%s\t%s\ttorch\t%s\t-\n%s\t%s\t%s\ttorch_tuned\t%s\t-\n' "$round" "$condition" "$model" "$torch" \
          "$round" "$condition" "$model" "$tuned" >>"$out/runs.tsv"
      fi
    done
    stop_load
    [[ $condition == loaded ]] && sed 's/^/  neighbour /' "$out/load.txt"
  done
  echo "round $round of $rounds done"
done

/usr/bin/python3 - "$out/runs.tsv" "$gemm_gflops" "$rounds" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
gemm, rounds = float(sys.argv[2]), int(sys.argv[3])
def median(condition, model, program):
    v = [float(r["samples_per_sec"]) for r in rows
         if (r["condition"], r["model"], r["program"]) == (condition, model, program)]
    return (statistics.median(v), min(v), max(v)) if v else None
print(f"\nmedians of {rounds} interleaved round(s), samples/s on one core (range):")
print(f"{'model':<5} {'condition':<9} {'ours':>22} {'torch':>22} {'torch tuned':>22} {'ratio':>6} {'r tuned':>7} {'of GEMM':>7}")
for model in dict.fromkeys(r["model"] for r in rows):
    for condition in dict.fromkeys(r["condition"] for r in rows):
        ours, torch, tuned = (median(condition, model, p) for p in ("ours", "torch", "torch_tuned"))
        if ours is None:
            continue
        flops = next(float(r["flops_per_sample"]) for r in rows if r["model"] == model and r["program"] == "ours")
        fmt = lambda m: f"{m[0]:,.0f} ({m[1]:,.0f}-{m[2]:,.0f})" if m else "-"
        ratio = lambda m: f"{ours[0] / m[0]:.2f}" if m else "-"
        print(f"{model:<5} {condition:<9} {fmt(ours):>22} {fmt(torch):>22} {fmt(tuned):>22} {ratio(torch):>6} "
              f"{ratio(tuned):>7} {flops * ours[0] / (gemm * 1e9):>7.0%}")
print(f"of GEMM: training FLOPs per sample (3 x forward's multiply-adds x 2) x samples/s over the "
      f"Eigen GEMM's {gemm:.1f} GFLOP/s on the same core")
PY
