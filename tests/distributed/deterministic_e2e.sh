#!/usr/bin/env bash
# End-to-end checks of distributed.deterministic with the real `trainer` (ctest: e2e_<case>).
#
#   deterministic_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (MNIST CNN, global batch 128, micro-batches of 16, lr_scaling none; exit 77 = skipped when
# data/mnist is absent). "Identical" means byte-identical model.safetensors and the same train and
# test loss in metrics.jsonl:
#   deterministic_sgd, _adam  30 steps: np 1 x 128, np 2 x 64 and np 4 x 32 (oversubscribed), the
#                             last two with the optimizer sharded (distributed.shard_optimizer); the
#                             same split into 2 backward passes per step, unsharded; 1 rank on 2
#                             threads; all identical, while without the mode np 1 and np 2 differ.
#                             Adam, and SGD in the sanitizer build, run the 2-pass split on 4 ranks
#                             only and skip the rest of the matrix: for Adam it tests nothing the
#                             optimizer changes (it sees only the summed gradient), and under ASan it
#                             runs the paths np 4 x 2 passes ran (DETERMINISTIC_FULL=1 runs all of it)
#   deterministic_dropout     an MLP with dropout, np 1 / 2 / 4: masks follow the micro-batch
#   deterministic_resume      a sharded 2-rank run killed (SIGKILL) after a checkpoint, resumed
#                             unsharded on 1 rank; another, resumed sharded on 4; both identical to
#                             the straight run. A resume that would change the micro-batches stops
#                             with one line naming the keys.
source "$(dirname "$0")/../e2e_common.sh"
need_mnist

# 30 steps of 128 out of 4096 samples (the last step of the epoch is never reached); evaluation on
# 1000 test samples in chunks of 300, so that ranks hold different numbers of chunks.
COMMON=(--set training.max_steps=30 --set training.epochs=1 --set optimizer.lr_scaling=none
        --set data.max_train_samples=4096 --set data.max_test_samples=1000 --set data.eval_batch_size=300)
BASE=("${COMMON[@]}" --set distributed.deterministic=true --set distributed.deterministic_micro_batch=16)
# The comparisons of runs (not the resume, whose checkpoints are placed in 30 steps) take 3 steps in
# the sanitizer build: the same micro-batches, reductions, masks and momentum, fewer of them.
SHORT=(--set training.max_steps="$(pick 30 3)")

# identical REFERENCE RUN...: each run's weights and metrics equal REFERENCE's, bit for bit.
identical() {
  local reference=$1 run key
  shift
  for run in "$@"; do
    cmp "$reference/model.safetensors" "$run/model.safetensors" || fail "$run differs from $reference"
    for key in train_loss test_loss test_accuracy; do
      [ "$($CHECK metric "$reference/metrics.jsonl" $key)" = "$($CHECK metric "$run/metrics.jsonl" $key)" ] ||
        fail "$key of $run ($($CHECK metric "$run/metrics.jsonl" $key)) differs from $reference's"
    done
  done
  echo "  identical to $reference: $*"
  echo "  sha256 $(sha256sum "$reference/model.safetensors" | cut -c1-64), train loss" \
    "$($CHECK metric "$reference/metrics.jsonl" train_loss), test accuracy" \
    "$($CHECK metric "$reference/metrics.jsonl" test_accuracy)"
}

case "$CASE" in
  deterministic_sgd | deterministic_adam)
    if [ "$CASE" = deterministic_sgd ]; then
      OPT=(--set optimizer.type=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9)
    else
      OPT=(--set optimizer.type=adam --set optimizer.lr=0.001)
    fi
    # Adam in the sanitizer build on the MLP: the optimizer sees only the summed gradient, and SGD
    # runs the convolutions' deterministic sums there already.
    MODEL=$([ "$CASE" = deterministic_sgd ] && echo mnist.json || pick mnist.json mnist_mlp.json)
    RUN=("$MODEL" "${BASE[@]}" "${OPT[@]}" "${SHORT[@]}")
    # ZeRO-1 sums the same integers, and the update is element by element: the same bits.
    SHARDED=(--set distributed.shard_optimizer=true)
    train 1 np1 "${RUN[@]}" --set data.batch_size=128
    train 2 np2 "${RUN[@]}" --set data.batch_size=64 "${SHARDED[@]}"
    train 4 np4 "${RUN[@]}" --set data.batch_size=32 "${SHARDED[@]}"
    grep -q "optimizer sharded over 4 rank(s)" np4.out || fail "np4 did not shard the optimizer"
    identical np1 np2 np4
    train 4 np4_k2 "${RUN[@]}" --set data.batch_size=16 --set distributed.backward_passes_per_step=2
    identical np1 np4_k2
    { [ "$CASE" = deterministic_sgd ] && ! small; } || [ "${DETERMINISTIC_FULL:-0}" = 1 ] || { echo "PASS: $CASE"; exit 0; }
    train 1 np1_k2 "${RUN[@]}" --set data.batch_size=64 --set distributed.backward_passes_per_step=2
    train 2 np2_k2 "${RUN[@]}" --set data.batch_size=32 --set distributed.backward_passes_per_step=2
    identical np1 np1_k2 np2_k2
    # (2 ranks x 2 threads would oversubscribe the 2 cores CI has.)
    train 1 np1_t2 "${RUN[@]}" --set data.batch_size=128 --set threads=2
    identical np1 np1_t2
    # Not vacuous: without the mode, np 2 and np 1 differ in the last bits (the batch split and the
    # allreduce add in another order).
    train 1 np1_plain "$MODEL" "${COMMON[@]}" "${OPT[@]}" "${SHORT[@]}" --set data.batch_size=128
    train 2 np2_plain "$MODEL" "${COMMON[@]}" "${OPT[@]}" "${SHORT[@]}" --set data.batch_size=64
    ! cmp -s np1_plain/model.safetensors np2_plain/model.safetensors ||
      fail "without distributed.deterministic np 1 and np 2 were identical too: this test shows nothing"
    echo "  without the mode: np1 and np2 differ ($($CHECK close np1_plain/model.safetensors np2_plain/model.safetensors 1 | tail -1))"
    ;;

  deterministic_dropout)
    MLP='[{"type":"flatten"},{"type":"dense","out_features":128},{"type":"relu"},{"type":"dropout","p":0.3},{"type":"dense","out_features":10}]'
    RUN=(mnist_mlp.json "${BASE[@]}" --set "model.layers=$MLP" --set optimizer.type=adam "${SHORT[@]}")
    train 1 np1 "${RUN[@]}" --set data.batch_size=128
    train 2 np2 "${RUN[@]}" --set data.batch_size=64
    train 4 np4 "${RUN[@]}" --set data.batch_size=32
    identical np1 np2 np4
    ;;

  deterministic_resume)
    # 30 steps with a checkpoint every 10 (the sanitizer build: 15 and 5).
    U=$(pick 10 5)
    OPT=(--set optimizer.type=adam --set optimizer.lr=0.001 --set optimizer.schedule=cosine
         --set checkpoint.every_steps=$U --set checkpoint.every_epochs=0 --set training.max_steps=$((3 * U)))
    # The CNN; the MLP in the sanitizer build (checkpoints and resumes do not depend on the layers).
    RUN=("$(pick mnist.json mnist_mlp.json)" "${BASE[@]}" "${OPT[@]}")
    train 1 straight "${RUN[@]}" --set data.batch_size=128
    # 2 ranks with the optimizer sharded, killed after step 17 (8): the newest checkpoint is step 10's
    # (5's), whole. Resumed unsharded on 1 rank x 128.
    SHARDED=(--set distributed.shard_optimizer=true)
    DPTRAIN_INJECT_FAULT=1:$((U + U * 7 / 10)):kill RUN_DIR=two_to_one launch 2 two_to_one_killed "${RUN[@]}" \
      --set data.batch_size=64 "${SHARDED[@]}"
    [ "$RC" -ne 0 ] && [ ! -e two_to_one/model.safetensors ] || fail "the 2-rank run was meant to be killed"
    RUN_DIR=two_to_one train 1 two_to_one_resumed "${RUN[@]}" --set data.batch_size=128 --resume auto
    grep -q "resuming from .*$(printf 'ckpt-%08d' $U)" two_to_one_resumed.out || fail "2 -> 1 did not resume from step $U"
    # 2 ranks sharded, killed after step 23 (11; newest checkpoint: 20, 10), resumed sharded on 4 x 32.
    DPTRAIN_INJECT_FAULT=0:$((2 * U + U * 3 / 10)):kill RUN_DIR=two_to_four launch 2 two_to_four_killed "${RUN[@]}" \
      --set data.batch_size=64 "${SHARDED[@]}"
    [ "$RC" -ne 0 ] && [ ! -e two_to_four/model.safetensors ] || fail "the 2-rank run was meant to be killed"
    RUN_DIR=two_to_four train 4 two_to_four_resumed "${RUN[@]}" --set data.batch_size=32 --resume auto "${SHARDED[@]}"
    grep -q "resuming from .*$(printf 'ckpt-%08d' $((2 * U)))" two_to_four_resumed.out ||
      fail "2 -> 4 did not resume from step $((2 * U))"
    cmp straight/model.safetensors two_to_one/model.safetensors || fail "2 -> 1 differs from the straight run"
    cmp straight/model.safetensors two_to_four/model.safetensors || fail "2 -> 4 differs from the straight run"
    echo "  sharded 2 -> unsharded 1 and sharded 2 -> sharded 4 byte-identical to the straight run: sha256" \
      "$(sha256sum straight/model.safetensors | cut -c1-64)"
    # Another global batch would change the micro-batches: every checkpoint is refused, naming the
    # keys, and the run stops rather than start afresh.
    RUN_DIR=two_to_four launch 2 other_batch "${RUN[@]}" --set data.batch_size=32 --resume auto
    [ "$RC" -ne 0 ] || fail "a resume with global batch 64 was accepted"
    grep -q "data.batch_size = 64" other_batch.err || fail "the refusal does not name data.batch_size: $(cat other_batch.err)"
    echo "  refused: $(grep -m1 dptrain other_batch.err | cut -c1-200)..."
    ;;

  *)
    echo "unknown case $CASE"
    exit 2
    ;;
esac
echo "PASS: $CASE"
