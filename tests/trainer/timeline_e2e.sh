#!/usr/bin/env bash
# End-to-end checks of what the trainer reports about where time goes (ctest: e2e_<case>).
#
#   timeline_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (exit 77 = skipped when data/mnist is absent):
#   timeline        distributed.timeline on 2 ranks writes a Chrome trace with a track per rank, the
#                   step phases, each bucket's allreduce on the communication thread and the
#                   checkpoint; the per-epoch breakdown is printed and recorded in metrics.jsonl
source "$(dirname "$0")/../e2e_common.sh"
need_mnist

case "$CASE" in
  timeline)
    # Small buckets, so several allreduces run on the communication thread during backward.
    train 2 run mnist.json --set data.max_train_samples=2048 --set data.max_test_samples=1000 \
      --set data.batch_size=64 --set training.epochs=1 --set distributed.fusion_threshold_mb=0.1 \
      --set distributed.first_bucket_mb=0.01 --set "distributed.timeline=\"$SCRATCH/run/timeline.json\""
    grep -E "^  per step .* ms: data .* compute .* communication not overlapped .* optimizer" run.out ||
      fail "no per-epoch step breakdown"
    grep -q "^timeline: $SCRATCH/run/timeline.json" run.out || fail "the timeline file was not announced"
    $CHECK timeline "$SCRATCH/run" $((2048 / (2 * 64))) || fail "timeline or metrics check failed"
    ;;
  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
