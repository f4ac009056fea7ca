#!/usr/bin/env bash
# End-to-end checks of the experiment scripts (ctest: e2e_<case>), kept short: they check that the
# scripts produce their outputs, not the figures (those are in the README and come from full runs).
#
#   scripts_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (exit 77 = skipped when data/mnist, gnuplot or network namespaces are unavailable):
#   scaling_sweep   scripts/scaling.sh at 1 and 2 ranks, fp32 and fp16: CSV rows, two PNG plots, the
#                   model's prediction table and extrapolation
#   netns_scaling   scripts/netns_scaling.sh with one throttled rate: 2 ranks in separate network
#                   namespaces over TCP, and the model's prediction for them
source "$(dirname "$0")/../e2e_common.sh"
need_mnist
BUILD=$(dirname "$TRAINER")  # the trainer sits at the top of the build directory

case "$CASE" in
  scaling_sweep)
    command -v gnuplot >/dev/null || { echo "SKIP: gnuplot is missing (scripts/setup.sh installs gnuplot-nox)"; exit 77; }
    bash "$SRC/scripts/scaling.sh" --build "$BUILD" --max-ranks 2 --compression "none fp16" --fusion 4 \
      --warmup 2 --steps 4 --reps 1 --out "$SCRATCH/sweep" >sweep.out 2>&1 || { cat sweep.out; fail "scaling.sh failed"; }
    sed 's/^/  /' sweep.out | tail -30
    [ "$(wc -l <"$SCRATCH/sweep/scaling.csv")" -eq 4 ] || fail "expected a header and 3 rows in scaling.csv"
    head -1 "$SCRATCH/sweep/scaling.csv" | grep -q "^ranks,compression,fusion_mb,samples_per_sec,efficiency" ||
      fail "unexpected CSV header"
    for png in throughput efficiency; do
      [ "$(head -c 4 "$SCRATCH/sweep/$png.png" | od -An -tx1 | tr -d ' ')" = 89504e47 ] || fail "$png.png is not a PNG"
    done
    grep -q "prediction against measurement" "$SCRATCH/sweep/model.txt" || fail "no prediction table"
    grep -q "ResNet-50" "$SCRATCH/sweep/model.txt" || fail "no ResNet-50 extrapolation"
    ;;
  netns_scaling)
    bash "$SRC/scripts/netns_scaling.sh" --build "$BUILD" --rates 100mbit --steps 3 --allreduce-seconds 0.02 --out "$SCRATCH/netns" >netns.out 2>&1
    rc=$?
    sed 's/^/  /' netns.out
    [ $rc -eq 77 ] && exit 77
    [ $rc -eq 0 ] || fail "netns_scaling.sh exited with $rc"
    grep -q "largest prediction error" "$SCRATCH/netns/100mbit/model.txt" || fail "no prediction for the throttled link"
    ;;
  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
