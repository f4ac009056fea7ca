#!/usr/bin/env bash
# End-to-end checks of GPU training with the real `trainer` (ctest: e2e_<case>). Each case needs a
# build with the CUDA backend and a GPU: without either it exits 77 (skipped) saying which is
# missing, and with DPTRAIN_REQUIRE_GPU=1 that is a failure instead.
#
#   gpu_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (MNIST subsets; the full-size acceptance runs are in docs/gpu.md):
#   gpu_training          the CNN on device "cuda", one short epoch: trains (test accuracy > 80%),
#                         and as the CPU does (within 1 point)
#   gpu_two_ranks         2 ranks on one GPU (distributed.backend "mpi") x 64 == 1 rank x 128, 20
#                         SGD steps with cuda.deterministic, max|diff| <= 1e-5 max|w|
#   gpu_checkpoint_interop a GPU checkpoint evaluates on the CPU within 0.02 points, and the reverse
#   gpu_resume_exact      cuda.deterministic: killed after step 70 and resumed, bitwise the straight run
source "$(dirname "$0")/../e2e_common.sh"
need_mnist

need_gpu() {
  # The trainer opens the CUDA backend as a module through its rpath: lib/ beside it in a build,
  # ../lib in the GPU bundle (bin/trainer).
  local why="this build has no CUDA backend (configure with -DDPTRAIN_CUDA=ON)" dir
  for dir in "$(dirname "$TRAINER")/lib" "$(dirname "$TRAINER")/../lib"; do
    [ -f "$dir/libdptrain_cuda.so" ] && why=""
  done
  if [ -z "$why" ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; }; then
    why="no GPU on this machine (nvidia-smi lists none)"
  fi
  [ -z "$why" ] && return 0
  [ "${DPTRAIN_REQUIRE_GPU:-0}" = 1 ] && fail "DPTRAIN_REQUIRE_GPU=1 but $why"
  echo "SKIP: $why"
  exit 77
}
need_gpu

SMALL=(--set data.max_train_samples=4096 --set data.max_test_samples=2000 --set training.epochs=1)
GPU=(--set device=cuda)

case "$CASE" in
  gpu_training)
    # 64 steps of Adam from the config: 82.9% on the CPU (4096 samples, batch 64, 2000 test images).
    train 1 run mnist.json "${SMALL[@]}" "${GPU[@]}" --set data.batch_size=64
    train 1 cpu mnist.json "${SMALL[@]}" --set data.batch_size=64
    grep -m1 "device cuda:" run.out | sed 's/^/  /'
    grep "^epoch 1:" run.out cpu.out | sed 's/^/  /'
    acc=$($CHECK metric run/metrics.jsonl test_accuracy)
    cpu_acc=$($CHECK metric cpu/metrics.jsonl test_accuracy)
    awk -v a="$acc" -v c="$cpu_acc" 'BEGIN { exit !(a > 0.8 && a - c < 0.01 && c - a < 0.01) }' ||
      fail "test accuracy $acc after one short epoch on the GPU ($cpu_acc on the CPU)"
    ;;

  gpu_two_ranks)
    # SGD with momentum: linear in the gradient, so only float rounding separates the runs. cuDNN's
    # heuristics may choose other algorithms for batch 64 than for 128; deterministic ones at least
    # add in a fixed order, so the bound does not depend on which atomics came first.
    OPT=(--set cuda.deterministic=true --set optimizer.type=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set optimizer.lr_scaling=none
         --set training.max_steps=20 --set optimizer.schedule=constant)
    train 1 np1 mnist.json "${SMALL[@]}" "${GPU[@]}" "${OPT[@]}" --set data.batch_size=128
    train 2 np2 mnist.json "${SMALL[@]}" "${GPU[@]}" "${OPT[@]}" --set data.batch_size=64 \
      --set distributed.backend=mpi
    $CHECK close np1/model.safetensors np2/model.safetensors 1e-5 || fail "2 ranks on one GPU differ from 1 x 128"
    ;;

  gpu_checkpoint_interop)
    train 1 gpu mnist.json "${SMALL[@]}" "${GPU[@]}"
    train 1 cpu mnist.json "${SMALL[@]}"
    # Each checkpoint evaluated on the device it was trained on and on the other one.
    for run in gpu cpu; do
      if [ "$run" = gpu ]; then same=cuda other=cpu; else same=cpu other=cuda; fi
      ckpt=$(ls "$SCRATCH/$run/checkpoints"/ckpt-*.safetensors | sort | tail -1)
      # On all 10,000 test images: 0.02 points is then 2 images.
      launch 1 "eval_${run}_on_$same" mnist.json "${SMALL[@]}" --set data.max_test_samples=0 --set device=$same \
        --evaluate "$ckpt"
      launch 1 "eval_${run}_on_$other" mnist.json "${SMALL[@]}" --set data.max_test_samples=0 --set device=$other \
        --evaluate "$ckpt"
      a=$(sed -n 's/.*(\([0-9]*\) of [0-9]* correct.*/\1/p' "eval_${run}_on_$same.out")
      b=$(sed -n 's/.*(\([0-9]*\) of [0-9]* correct.*/\1/p' "eval_${run}_on_$other.out")
      echo "  $run checkpoint: $a correct on $same, $b on $other (of 10000)"
      [ -n "$a" ] && [ -n "$b" ] || fail "an evaluation of the $run checkpoint failed"
      d=$((a > b ? a - b : b - a))
      [ "$d" -le 2 ] || fail "the $run checkpoint evaluates $d images apart on $other (> 0.02 points)"
    done
    ;;

  gpu_resume_exact)
    RUN=(mnist.json "${SMALL[@]}" "${GPU[@]}" --set cuda.deterministic=true --set data.max_train_samples=3200
         --set training.epochs=3 --set data.batch_size=32 --set checkpoint.every_steps=20 --set checkpoint.every_epochs=0)
    train 1 straight "${RUN[@]}"
    DPTRAIN_INJECT_FAULT=0:70:kill RUN_DIR=run launch 1 killed "${RUN[@]}"
    [ "$RC" -ne 0 ] || fail "the run meant to be killed exited 0"
    RUN_DIR=run train 1 resumed "${RUN[@]}" --resume auto
    cmp straight/model.safetensors run/model.safetensors || fail "resumed weights differ from the straight run's"
    echo "  killed after step 70, resumed from $(sed -n 's/^dptrain: resuming from \([^:]*\):.*/\1/p' resumed.out):"\
         "final weights bitwise identical"
    ;;

  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
