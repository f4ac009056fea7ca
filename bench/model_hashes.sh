#!/usr/bin/env bash
# sha256 of the final model.safetensors in the runs that a refactor must leave bit for bit alike:
# MNIST 1 epoch at np 1 and 2, fp16 at np 2, PowerSGD at np 2 (200 steps), deterministic mode at np 1
# and 4, resnet20 with and without SyncBN at np 2 (20 steps, synthetic data), resnet50 at 224x224 (3
# steps of 4), and a kill -9 at step 60 resumed from the step-50 checkpoint. Run it with the old and
# the new build's trainer and compare the lines.
#
#   bench/model_hashes.sh TRAINER OUTDIR      (needs data/mnist; one thread per rank)
set -uo pipefail
[[ $# -eq 2 ]] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer=$(realpath "$1") out=$(realpath -m "$2")
mkdir -p "$out"
cd "$repo_root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--set training.progress=off --set threads=1)

# run NAME NP CONFIG [--set ...]: one line, "NAME rc=STATUS SHA256-PREFIX".
run() {
  local name=$1 np=$2 config=$3
  shift 3
  rm -rf "${out:?}/$name"
  mpirun --oversubscribe -np "$np" "$trainer" --config "$config" "${common[@]}" --set output_dir="$out/$name" \
    "$@" >"$out/$name.log" 2>&1 </dev/null
  echo "$name rc=$? $(sha256sum "$out/$name/model.safetensors" 2>/dev/null | cut -c1-16)"
}

run mnist_np1 1 configs/mnist.json --set training.epochs=1
run mnist_np2 2 configs/mnist.json --set training.epochs=1
run fp16_np2 2 configs/mnist.json --set training.epochs=1 --set distributed.compression=fp16
run powersgd_np2 2 configs/mnist.json --set training.max_steps=200 --set distributed.compression=powersgd
run deterministic_np1 1 configs/mnist.json --set training.max_steps=40 --set distributed.deterministic=true
run deterministic_np4 4 configs/mnist.json --set training.max_steps=40 --set distributed.deterministic=true
run resnet20_syncbn_np2 2 configs/resnet20_fashion_mnist.json --set data.dataset=synthetic --set data.batch_size=16 \
  --set data.synthetic.samples=512 --set data.synthetic.test_samples=64 --set training.max_steps=20 \
  --set distributed.sync_batchnorm=true --set optimizer.warmup_epochs=0
run resnet20_np2 2 configs/resnet20_fashion_mnist.json --set data.dataset=synthetic --set data.batch_size=16 \
  --set data.synthetic.samples=512 --set data.synthetic.test_samples=64 --set training.max_steps=20 \
  --set optimizer.warmup_epochs=0
run resnet50_np1 1 configs/resnet50_synthetic.json --set data.batch_size=4 --set data.synthetic.samples=16 \
  --set data.synthetic.test_samples=4 --set training.max_steps=3
killed=(--set training.max_steps=120 --set checkpoint.every_steps=50)
rm -rf "${out:?}/kill_resume"
DPTRAIN_INJECT_FAULT=1:60:kill mpirun --oversubscribe -np 2 "$trainer" --config configs/mnist.json "${common[@]}" \
  --set output_dir="$out/kill_resume" "${killed[@]}" >"$out/kill_resume.killed.log" 2>&1 </dev/null
echo "kill_at_step_60 rc=$?"
mpirun --oversubscribe -np 2 "$trainer" --config configs/mnist.json "${common[@]}" --set output_dir="$out/kill_resume" \
  "${killed[@]}" --resume auto >"$out/kill_resume.log" 2>&1 </dev/null
echo "kill_resume rc=$? $(sha256sum "$out/kill_resume/model.safetensors" 2>/dev/null | cut -c1-16)"
