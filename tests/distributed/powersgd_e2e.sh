#!/usr/bin/env bash
# End-to-end checks of distributed.compression "powersgd" with the real `trainer` (ctest: e2e_<case>).
#
#   powersgd_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (MNIST CNN on 2 ranks, 60 steps, PowerSGD rank 2 from step 10, all halved in the sanitizer
# build; exit 77 = skipped when data/mnist is absent):
#   powersgd_resume  a run killed by kill -9 after step 47 (newest checkpoint: 40) and resumed with
#                    --resume auto ends byte-identical to the straight run, so Q and every rank's
#                    error buffer came back; a resume on 1 rank takes the errors' sum and finishes;
#                    PowerSGD switched on and off at resumes
#   powersgd_bytes   metrics.jsonl's gradient_bytes_per_step for none, fp16 and powersgd (from
#                    step 0) against the payloads the parameter shapes give
source "$(dirname "$0")/../e2e_common.sh"
need_mnist

# Step numbers in units of U: U = 10 (the sanitizer build: 5). 6U steps, a checkpoint every 2U,
# PowerSGD from step U; the kill after step 4U + 7 (4U + 2) finds the checkpoint of step 4U.
U=$(pick 10 5)
ckpt() { printf 'ckpt-%08d' "$1"; }
COMMON=(--set training.max_steps=$((6 * U)) --set training.epochs=1 --set data.max_train_samples=8192
        --set data.max_test_samples=1000 --set data.batch_size=64 --set checkpoint.every_steps=$((2 * U))
        --set checkpoint.every_epochs=0)
PSGD=(--set 'distributed.compression="powersgd"' --set distributed.powersgd.start_step=$U)

case "$CASE" in
  powersgd_resume)
    # The CNN; the sanitizer build the MLP, whose two dense matrices PowerSGD compresses alike.
    MODEL=$(pick mnist.json mnist_mlp.json)
    train 2 straight "$MODEL" "${COMMON[@]}" "${PSGD[@]}"
    grep -q "^powersgd: rank 2 from step $U" straight.out || fail "no powersgd summary line: $(cat straight.out)"
    kill_at=$((4 * U + $(pick 7 2)))
    DPTRAIN_INJECT_FAULT=1:$kill_at:kill RUN_DIR=resumed launch 2 killed "$MODEL" "${COMMON[@]}" "${PSGD[@]}"
    [ "$RC" -ne 0 ] && [ ! -e resumed/model.safetensors ] || fail "the run was meant to be killed after step $kill_at"
    RUN_DIR=resumed train 2 resumed "$MODEL" "${COMMON[@]}" "${PSGD[@]}" --resume auto
    grep -q "resuming from .*$(ckpt $((4 * U)))" resumed.out || fail "did not resume from step $((4 * U)): $(cat resumed.out)"
    cmp straight/model.safetensors resumed/model.safetensors ||
      fail "the resumed run differs from the straight run ($($CHECK close straight/model.safetensors resumed/model.safetensors 1 | tail -1))"
    echo "  kill -9 after step $kill_at, resumed from $((4 * U)): byte-identical, sha256" \
      "$(sha256sum straight/model.safetensors | cut -c1-64)"
    # Not vacuous: without the error buffers (a resume that dropped them) the weights would differ;
    # a run that never compressed differs too.
    train 2 plain "$MODEL" "${COMMON[@]}"
    ! cmp -s straight/model.safetensors plain/model.safetensors || fail "powersgd changed nothing"
    # On one rank: the two error buffers are summed into rank 0's, and training goes on.
    RUN_DIR=one_rank launch 2 one_rank_killed "$MODEL" "${COMMON[@]}" "${PSGD[@]}" --set training.max_steps=$((4 * U))
    RUN_DIR=one_rank train 1 one_rank "$MODEL" "${COMMON[@]}" "${PSGD[@]}" --set data.batch_size=128 --resume auto
    grep -q "error buffers of 2 rank(s) summed into rank 0's" one_rank.out || fail "no note of the summed errors"
    echo "  2 -> 1 ranks: $(grep -m1 'summed into' one_rank.out)"
    # Switched on at a resume (the plain run's checkpoint of step 4U holds no PowerSGD state) and off
    # again at 5U: both go on, the first saying so.
    rm -rf switch && cp -r plain switch && rm -f switch/model.safetensors "switch/checkpoints/$(ckpt $((6 * U))).safetensors"
    RUN_DIR=switch train 2 switch_on "$MODEL" "${COMMON[@]}" "${PSGD[@]}" --resume auto --set training.max_steps=$((5 * U))
    grep -q "holds no PowerSGD state" switch_on.out || fail "no note that the checkpoint had no PowerSGD state"
    RUN_DIR=switch train 2 switch_off "$MODEL" "${COMMON[@]}" --resume auto
    grep -q "resuming from .*$(ckpt $((5 * U)))" switch_off.out || fail "switching PowerSGD off did not resume from $((5 * U))"
    echo "  PowerSGD switched on at step $((4 * U)) and off at step $((5 * U)): $(grep -m1 'holds no PowerSGD' switch_on.out | cut -c1-60)..."
    ;;

  powersgd_bytes)
    # MNIST CNN: conv1 [32, 1, 3, 3], conv2 [64, 32, 3, 3], dense [64, 1600], dense [10, 64] and the
    # biases; each tensor starts on a 16-float boundary in the flat buffer that is reduced.
    padded() { echo $(( ($1 + 15) / 16 * 16 )); }
    flat=0
    for n in 288 32 18432 64 102400 64 640 10; do flat=$((flat + $(padded $n))); done
    # At rank 2 every weight compresses ((n + m) x 2 x 2 < n m): conv1 32 x 9, conv2 64 x 288, dense
    # 64 x 1600 and 10 x 64, each as a P of n x 2 and a Q of m x 2; the biases go as they are.
    compressed=$(( (32 + 9) * 2 + (64 + 288) * 2 + (64 + 1600) * 2 + (10 + 64) * 2 ))
    uncompressed=$((32 + 64 + 64 + 10))
    for mode in none fp16 powersgd; do
      extra=(--set "distributed.compression=\"$mode\"")
      [ $mode = powersgd ] && extra+=(--set distributed.powersgd.start_step=0)
      train 2 bytes_$mode mnist.json "${COMMON[@]}" --set training.max_steps=5 "${extra[@]}"
    done
    expect() {
      local got
      got=$($CHECK metric "bytes_$1/metrics.jsonl" gradient_bytes_per_step)
      awk -v g="$got" -v e="$2" 'BEGIN { exit !(g == e) }' || fail "$1: gradient_bytes_per_step $got, expected $2"
      echo "  $1: $got bytes per step per rank"
    }
    expect none $((4 * flat))
    expect fp16 $((2 * flat))
    expect powersgd $((4 * (compressed + uncompressed)))
    echo "  powersgd sends $(awk -v a=$flat -v b=$((compressed + uncompressed)) 'BEGIN { printf "%.1f", a / b }')x fewer bytes than fp32"
    ;;

  *)
    echo "unknown case $CASE"
    exit 2
    ;;
esac
echo "PASS: $CASE"
