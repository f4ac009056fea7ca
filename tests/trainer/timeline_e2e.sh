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
    python3 - "$SCRATCH/run" <<'PYEOF' || fail "timeline or metrics check failed"
import collections, json, sys
run = sys.argv[1]
events = json.load(open(f"{run}/timeline.json"))["traceEvents"]
spans = [e for e in events if e["ph"] == "X"]
names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert names == {"rank 0", "rank 1"}, names
steps = 2048 // (2 * 64)
for rank in (0, 1):
    mine = [e for e in spans if e["pid"] == rank]
    count = collections.Counter(e["name"].split(" bucket")[0] for e in mine)
    for phase in ("data", "forward", "backward", "finish gradient averaging", "optimizer"):
        assert count[phase] == steps, (rank, phase, count[phase])
    on_comm_thread = [e for e in mine if e["tid"] == 1 and e["name"].startswith("allreduce bucket ")]
    assert len(on_comm_thread) >= steps, (rank, len(on_comm_thread))  # overlapped buckets
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in mine)
    # Every step's phases come in order on the main thread.
    main = sorted((e for e in mine if e["tid"] == 0 and e["name"] in ("forward", "backward", "optimizer")),
                  key=lambda e: e["ts"])
    assert [e["name"] for e in main[:3]] == ["forward", "backward", "optimizer"], [e["name"] for e in main[:3]]
assert any(e["name"] == "checkpoint" and e["pid"] == 0 for e in spans), "no checkpoint span on rank 0"
print(f"  timeline: {len(spans)} spans, {len({(e['pid'], e['tid']) for e in spans})} tracks; "
      f"allreduce spans on the communication threads: {sum(e['tid'] == 1 for e in spans)}")
line = json.loads(open(f"{run}/metrics.jsonl").read().splitlines()[-1])
parts = line["step_ms"]
assert parts["total"] > 0 and parts["compute"] > 0, parts
assert parts["data"] + parts["compute"] + parts["communication"] + parts["optimizer"] <= parts["total"] * 1.01, parts
print("  metrics step_ms:", {k: round(v, 2) for k, v in parts.items()})
PYEOF
    ;;
  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
