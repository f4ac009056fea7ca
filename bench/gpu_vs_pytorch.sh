#!/usr/bin/env bash
# On a GPU machine: the trainer's own step (build/bench/train_bench, device "cuda") against PyTorch
# eager (bench/torch_gpu_bench.py) in the same call, CNN and MLP at batch 128 and 1024, median of
# repetitions each, and the ratio; then the wall time of 5 MNIST epochs of configs/mnist.json, ours
# and PyTorch's. Needs a build with the CUDA backend (or the GPU bundle: scripts/gpu_bundle.sh) and
# a python3 with torch (PYTHON=... names another; on the GPU image the python3 first on PATH has it).
# Both sides let cuDNN time its convolution algorithms (PyTorch's side sets
# torch.backends.cudnn.benchmark; ours cuda.cudnn_benchmark) and neither uses TF32.
#
#   bench/gpu_vs_pytorch.sh [--bin DIR] [--data DIR] [--steps N] [--reps N] [--no-epochs]
#
# The 5-epoch run writes its logs and checkpoints into a temporary folder, removed at exit.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$repo_root/build" data="$repo_root/data/mnist" steps=200 reps=5 epochs=1
while (($#)); do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --no-epochs) epochs=0; shift ;;
    *) echo "gpu_vs_pytorch.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
# A build has bench/train_bench, the GPU bundle bin/train_bench.
train_bench="$bin/bench/train_bench"
[[ -x "$train_bench" ]] || train_bench="$bin/train_bench"
trainer="$bin/trainer"
[[ -x "$train_bench" && -x "$trainer" ]] || { echo "gpu_vs_pytorch.sh: no train_bench / trainer under $bin" >&2; exit 1; }
python=${PYTHON:-python3}
"$python" -c 'import torch' 2>/dev/null ||
  { echo "gpu_vs_pytorch.sh: '$python' cannot import torch; name one that can with PYTHON=..." >&2; exit 1; }
# PyTorch's side (bench/torch_gpu_bench.py) sets cudnn.benchmark and turns TF32 off: ours the same.
ours_settings=(--set device=cuda --set cuda.cudnn_benchmark=true --set cuda.tf32=false)
# A side that failed has printed its error and no RESULT line: stop there, without a traceback.
value() {
  local result
  result=$(sed -n 's/^RESULT //p')
  [[ -n $result ]] || return 1
  "$python" -c 'import json,sys; print(json.loads(sys.argv[2])[sys.argv[1]])' "$1" "$result"
}

printf '%-5s %6s %14s %14s %7s\n' model batch "ours samples/s" "torch samples/s" ratio
for model in cnn mlp; do
  config="$repo_root/configs/mnist.json"
  [[ $model == mlp ]] && config="$repo_root/configs/mnist_mlp.json"
  for batch in 128 1024; do
    ours=$("$train_bench" --config "$config" "${ours_settings[@]}" --set "data.dir=\"$data\"" --batch "$batch" \
             --warmup 50 --steps "$steps" --reps "$reps" | value samples_per_sec)
    torch=$("$python" "$repo_root/bench/torch_gpu_bench.py" --model "$model" --data "$data" --batch "$batch" \
              --steps "$steps" --reps "$reps" | value samples_per_sec)
    "$python" -c "o, t = $ours, $torch; print(f'{\"$model\":<5} {$batch:>6} {o:>14,.0f} {t:>14,.0f} {o / t:>7.2f}')"
  done
done

if ((epochs)); then
  run_dir=$(mktemp -d)
  trap 'rm -rf "$run_dir"' EXIT
  start=$(date +%s.%N)
  "$trainer" --config "$repo_root/configs/mnist.json" "${ours_settings[@]}" --set "data.dir=\"$data\"" \
    --set "output_dir=\"$run_dir\"" --set training.progress=off | grep "^epoch"
  ours_s=$("$python" -c "import time; print(f'{time.time() - $start:.1f}')")
  torch_s=$("$python" "$repo_root/bench/torch_gpu_bench.py" --model cnn --data "$data" --epochs 5 | value seconds)
  echo "5 MNIST epochs (configs/mnist.json): ours ${ours_s} s, PyTorch eager ${torch_s} s"
fi
