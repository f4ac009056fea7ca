#!/usr/bin/env bash
# Data-parallel scaling on this machine, one thread per rank, batch 128 per rank, in one run:
#   T1       ours, 1 rank
#   T2       ours, mpirun -np 2
#   ceiling  two independent 1-rank runs at the same time, one per core, summed: what two ranks
#            could reach with communication for free (memory bandwidth and caches are shared)
#   DDP      PyTorch DistributedDataParallel (gloo) on the same model, ../shared/anchors/torch_ddp.py
# Efficiency = T2 / (2 T1); "of ceiling" = T2 / ceiling, measured in --pairs interleaved pairs
# (T2, then its ceiling) so that a slow spell of the VM lands on both sides of a ratio; the median
# ratio is the figure.
#
#   bench/scaling_vs_ddp.sh [build-dir] [model: cnn|mlp] [pairs (default 5)]
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(realpath -m "${1:-$repo_root/build}")"
model="${2:-cnn}"
pairs="${3:-5}"
[[ $model == cnn || $model == mlp ]] || { echo "scaling_vs_ddp: the model is cnn or mlp, not '$model'" >&2; exit 2; }
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "scaling_vs_ddp: pairs must be a positive integer, got '$pairs'" >&2; exit 2; }
cd "$repo_root"  # the configs' data.dir, data/mnist, is relative to the repository
anchors="$repo_root/../shared/anchors"
bench="$build/bench/train_bench"
[[ -x "$bench" ]] || { echo "scaling_vs_ddp: $bench not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
config="$repo_root/configs/mnist.json"; steps=60
[[ $model == mlp ]] && { config="$repo_root/configs/mnist_mlp.json"; steps=600; }
args=(--config "$config" --threads 1 --steps "$steps" --reps 5)
result() { sed -n 's/^RESULT //p' | /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); v=r.get("samples_per_sec", r.get("samples_per_s", r.get("global_samples_per_s"))); print(v["median"] if isinstance(v, dict) else v)'; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPU(s) for this process"
t1=$(taskset -c 0 "$bench" "${args[@]}" | result)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
t2s=() ceilings=()
for ((pair = 1; pair <= pairs; pair++)); do
  t2s+=("$(mpirun -np 2 --bind-to core "$bench" "${args[@]}" | result)")
  taskset -c 0 "$bench" "${args[@]}" > "$tmp/a" & first=$!
  taskset -c 1 "$bench" "${args[@]}" > "$tmp/b" & second=$!
  wait "$first"; wait "$second"  # a failed run stops the script (set -e) instead of halving the ceiling
  ceilings+=("$(/usr/bin/python3 -c "print($(result < "$tmp/a") + $(result < "$tmp/b"))")")
  /usr/bin/python3 -c "print(f'pair $pair of $pairs: 2 ranks {${t2s[-1]}:,.0f} samples/s, ceiling {${ceilings[-1]}:,.0f}, ratio {${t2s[-1]}/${ceilings[-1]}:.3f}')"
done

ddp="n/a"
if [[ -f "$anchors/torch_ddp.py" ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null && [[ -d /usr/share/datasets/fashion-mnist ]]; then
  d1=$(/usr/bin/python3 "$anchors/torch_ddp.py" --np 1 --model "$model" --steps "$steps" --reps 5 --pin 2>/dev/null | result)
  d2=$(/usr/bin/python3 "$anchors/torch_ddp.py" --np 2 --model "$model" --steps "$steps" --reps 5 --pin 2>/dev/null | result)
  ddp=$(/usr/bin/python3 -c "print(f'{$d2/(2*$d1):.3f} ({$d1:,.0f} -> {$d2:,.0f} samples/s)')")
else
  echo "(PyTorch DDP skipped: needs /usr/bin/python3 with torch, dataset-fashion-mnist and $anchors)"
fi
/usr/bin/python3 - <<PY
import statistics
t1, t2s, cs = $t1, [$(IFS=,; echo "${t2s[*]}")], [$(IFS=,; echo "${ceilings[*]}")]
t2, c = statistics.median(t2s), statistics.median(cs)
ratios = [a / b for a, b in zip(t2s, cs)]
print(f"model {'$model'}: 1 rank {t1:,.0f} samples/s | 2 ranks {t2:,.0f} (median of {len(t2s)}) | ceiling (2 independent) {c:,.0f}")
print(f"efficiency T2/(2 T1) = {t2/(2*t1):.3f} | T2 / ceiling = {statistics.median(ratios):.3f} "
      f"(median of {len(ratios)} pairs; {min(ratios):.3f}-{max(ratios):.3f}) | PyTorch DDP (gloo) efficiency = $ddp")
PY
