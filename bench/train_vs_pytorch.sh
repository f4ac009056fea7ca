#!/usr/bin/env bash
# Training throughput on one thread at batch 128, ours against PyTorch on the same model, in one run.
#
#   bench/train_vs_pytorch.sh [build-dir]      (default: build)
#
# Ours: build/bench/train_bench (random inputs). PyTorch: ../shared/anchors/torch_cnn.py, the peer
# anchor (same CNN / MLP, Adam, batch 128, one thread), run twice: glibc malloc as shipped, and with
# the anchor's "tuned" malloc settings (which keep freed memory instead of returning it to the OS;
# our storage cache does the equivalent). Ratios are against the as-shipped figure and the tuned one.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo_root/build}"
anchors="$repo_root/../shared/anchors"
bench="$build/bench/train_bench"
[[ -x "$bench" ]] || { echo "train_vs_pytorch: $bench not built (cmake --build $build --target train_bench)" >&2; exit 1; }

result() { sed -n 's/^RESULT //p' | /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); v=r.get("samples_per_sec", r.get("samples_per_s", r.get("global_samples_per_s"))); print(v["median"] if isinstance(v, dict) else v)'; }

have_torch=0
if [[ -f "$anchors/torch_cnn.py" ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null \
   && [[ -d /usr/share/datasets/fashion-mnist ]]; then
  have_torch=1
else
  echo "PyTorch comparison skipped: needs /usr/bin/python3 with torch (python3-torch), dataset-fashion-mnist and $anchors"
fi

printf '%-5s %12s %14s %14s %8s %8s\n' model "ours" "torch" "torch tuned" ratio "r tuned"
for model in cnn mlp; do
  config="$repo_root/configs/mnist.json"; steps=100
  [[ $model == mlp ]] && { config="$repo_root/configs/mnist_mlp.json"; steps=1000; }
  ours=$(cd "$repo_root" && "$bench" --config "$config" --threads 1 --steps "$steps" --reps 5 | result)
  if [[ $have_torch == 1 ]]; then
    torch=$(/usr/bin/python3 "$anchors/torch_cnn.py" --model $model --threads 1 --steps "$steps" --reps 5 | result)
    tuned=$(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=68719476736 \
            /usr/bin/python3 "$anchors/torch_cnn.py" --model $model --threads 1 --steps "$steps" --reps 5 | result)
    /usr/bin/python3 -c "o,t,u=$ours,$torch,$tuned; print(f'{\"$model\":<5} {o:12,.0f} {t:14,.0f} {u:14,.0f} {o/t:8.2f} {o/u:8.2f}')"
  else
    printf '%-5s %12.0f %14s %14s %8s %8s\n' $model "$ours" - - - -
  fi
done
