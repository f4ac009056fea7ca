#!/usr/bin/env bash
# End-to-end checks of what clusters do to jobs, with the real `trainer` (ctest: e2e_<case>).
#
#   signals_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (the MNIST CNN on a subset, 2 ranks; exit 77 = skipped when data/mnist is absent):
#   stop_sigterm_mpirun   SIGTERM to mpirun mid-run: the ranks stop after the same step, rank 0
#                         writes that step's checkpoint and stopped.json; mpirun itself exits 1 (Open
#                         MPI's own status for a SIGTERM it receives); the same command without
#                         --resume is refused and leaves both; --resume auto then ends with
#                         model.safetensors byte-identical to a run never stopped
#   stop_sigusr1          the same with SIGUSR1, which mpirun forwards: mpirun exits 75
#   stop_sigterm_one_rank SIGTERM to one rank's process only: every rank stops, status 75
#   second_sigint         one process stuck in a step, SIGINT twice: it says it took the first and
#                         stops at once with status 130 on the second, with no stopped.json
#   checkpoint_full_disk  checkpoint.dir on a 1 MiB tmpfs that holds one checkpoint, not two:
#                         on_error "stop" ends the run with one line naming the file and ENOSPC, the
#                         first checkpoint still loads and no temp file is left; "warn" finishes
#                         (needs root to mount the tmpfs; skipped otherwise), and stopped by
#                         SIGUSR1 with the disk full it exits 75 saying that no checkpoint was
#                         written; then the tmpfs read-only: the run stops at start naming it and EROFS
#   stop_at_epoch_end     a stop after an epoch's last step (DPTRAIN_INJECT_FAULT kind sigusr1) still
#                         evaluates that epoch and writes its metrics line, after the checkpoint; the
#                         resume starts the next epoch and ends bitwise equal to a straight run
#   output_dir_lock       a second trainer on a running job's output_dir stops at start naming the
#                         holder, and so does one whose checkpoint.dir is the holder's; once the
#                         holder is SIGKILLed, a third takes the lock over, saying so
source "$(dirname "$0")/../e2e_common.sh"
need_mnist

# 8192 samples / (2 ranks x 32) = 128 steps per epoch, 2 epochs (the sanitizer build: 1024 / (2 x 8),
# 1 epoch: 64 steps); a checkpoint every 20 steps. The signal goes out once step 20's checkpoint
# exists; a SIGTERM to mpirun reaches the ranks 1 s later, so the run must have that second left with
# room to spare, on any machine: the run to be stopped sleeps SLOW_MS before each step
# (DPTRAIN_INJECT_FAULT kind slow), so at most 1000 / SLOW_MS steps pass in that second and at least
# 186 steps (3.7 s) are left after it (the sanitizer build: 28 steps, 1.7 s). Before the sleeps the
# run was 6 epochs long so that a Zen 4 VM would not finish first (it ran 2 epochs in 1.1 s), and the
# three cases took 40-48 s each in CI.
EPOCHS=$(pick 2 1)
STEPS=$(($(pick 128 64) * EPOCHS))
SLOW_MS=$(pick 20 60)
RUN=(mnist.json --set data.max_train_samples="$(pick 8192 1024)" --set data.max_test_samples=500
     --set data.batch_size="$(pick 32 8)" --set training.epochs="$EPOCHS" --set checkpoint.every_steps=20
     --set checkpoint.every_epochs=0)

# start NP NAME CONFIG...: launches like `launch` but in the background; PID holds its process.
start() {
  local np=$1 name=$2 config=$3
  shift 3
  local cmd=("$TRAINER" --config "$SRC/configs/$config" --set "output_dir=\"$SCRATCH/${RUN_DIR:-$name}\""
             --set threads=1 --set "data.dir=\"$MNIST_DIR\"" "${SMALL_DATA[@]}" "$@")
  [ "$np" -gt 1 ] && cmd=("$MPIEXEC" -np "$np" --oversubscribe -x DPTRAIN_INJECT_FAULT "${cmd[@]}")
  DPTRAIN_INJECT_FAULT=${DPTRAIN_INJECT_FAULT:-} "${cmd[@]}" >"$name.out" 2>"$name.err" &
  PID=$!
}

# finish NAME: waits for the background launch; RC = its status, ELAPSED = seconds since STAMP.
finish() {
  RC=0
  wait "$PID" || RC=$?
  ELAPSED=$(since "$STAMP")
  printf '  %-28s exit %d, %s s after the signal\n' "$1" "$RC" "$ELAPSED"
}

# stop_and_resume SIGNAL TARGET EXPECTED_STATUS EXPECTED_REQUESTS: a run signalled after its step-20
# checkpoint, then resumed; TARGET is "mpirun" or "rank" (one rank's process); EXPECTED_REQUESTS is
# what stopped.json must say stopped it, an extended regex ("SIGTERM on 2 ranks").
stop_and_resume() {
  local signal=$1 target=$2 expected=$3 requests=$4
  train 2 straight "${RUN[@]}"
  DPTRAIN_INJECT_FAULT=0:0:slow:$SLOW_MS RUN_DIR=run start 2 stopped "${RUN[@]}"
  wait_for "$SCRATCH/run/checkpoints/ckpt-00000020.safetensors"
  local victim=$PID
  if [ "$target" = rank ]; then
    victim=$(children_of "$PID" | head -1)
    [ -n "$victim" ] || fail "no rank process under mpirun $PID"
  fi
  STAMP=$(date +%s.%N)
  kill -"$signal" "$victim"
  finish stopped
  sed 's/^/    /' stopped.err | grep -v '^    $' | head -5
  [ "$RC" -eq "$expected" ] || fail "expected exit status $expected, got $RC"
  awk -v t="$ELAPSED" 'BEGIN { exit !(t <= 5) }' || fail "the job took ${ELAPSED} s to end (limit 5 s)"
  [ -s "$SCRATCH/run/stopped.json" ] || fail "no stopped.json"
  local step
  step=$(sed -n 's/.*"global_step":\([0-9]*\).*/\1/p' "$SCRATCH/run/stopped.json")
  echo "  stopped.json: $(cat "$SCRATCH/run/stopped.json")"
  grep -Eq "\"stopped_by\":\"($requests)\"" "$SCRATCH/run/stopped.json" || fail "stopped.json does not say $requests"
  [ -n "$step" ] && [ "$step" -ge 20 ] && [ "$step" -lt "$STEPS" ] || fail "stopped at step '$step', not mid-run"
  local ckpt=$SCRATCH/run/checkpoints/ckpt-$(printf %08d "$step").safetensors
  [ -e "$ckpt" ] || fail "no checkpoint of the step it stopped at ($ckpt)"
  [ ! -e "$SCRATCH/run/model.safetensors" ] || fail "a stopped run wrote final weights"
  grep -q "exiting with status 75" stopped.err || fail "no line saying the run stopped with status 75"
  # Relaunched without --resume, the run refuses to start afresh over the stopped one's checkpoint.
  RUN_DIR=run launch 2 forgot "${RUN[@]}"
  [ "$RC" -ne 0 ] || fail "a fresh start over a stopped run's checkpoint was not refused"
  grep -q "stopped.json: a run stopped by .* after step $step, with its checkpoint; continue it with --resume auto" \
    forgot.err || fail "no line naming the stopped run and --resume auto: $(grep dptrain forgot.err)"
  [ -e "$ckpt" ] && [ -e "$SCRATCH/run/stopped.json" ] || fail "the refused start removed the stopped run's files"
  RUN_DIR=run train 2 resumed "${RUN[@]}" --resume auto
  grep -q "resuming from $ckpt" resumed.out || fail "did not resume from $ckpt: $(grep resuming resumed.out)"
  [ ! -e "$SCRATCH/run/stopped.json" ] || fail "stopped.json outlived the resumed run's start"
  cmp straight/model.safetensors run/model.safetensors || fail "resumed weights differ from the straight run's"
  echo "  stopped at step $step with its checkpoint; resumed run's weights bitwise identical to the straight run's"
}

case "$CASE" in
  stop_sigterm_mpirun)
    # Open MPI's mpirun answers SIGTERM by signalling the ranks SIGTERM after
    # odls_base_sigkill_timeout (1 s) and SIGKILL after as long again, and exits 1 itself. It signals
    # the ranks one after the other: the step at which they agree to stop may have seen one or both
    # (seen once in CI: "SIGTERM on 1 rank"), and either way every rank stops after that step.
    stop_and_resume TERM mpirun 1 "SIGTERM on 1 rank|SIGTERM on 2 ranks"
    ;;

  stop_sigusr1)
    stop_and_resume USR1 mpirun 75 "SIGUSR1 on 1 rank|SIGUSR1 on 2 ranks"  # forwarded one rank at a time too
    ;;

  stop_sigterm_one_rank)
    stop_and_resume TERM rank 75 "SIGTERM on 1 rank"
    ;;

  second_sigint)
    # The rank hangs before step 25 (DPTRAIN_INJECT_FAULT kind hang), as a job stuck in a step
    # would: the first SIGINT is taken (its handler says so) but the agreed stop never comes, so
    # the second is what ends it. Each SIGINT waits for the line of the one before: two sent back
    # to back can merge into one pending signal before the process runs (seen on the Intel VMs).
    DPTRAIN_INJECT_FAULT=0:24:hang RUN_DIR=run start 1 interrupted "${RUN[@]}"
    wait_for_line() { # FILE TEXT: until FILE holds TEXT (30 s), else fail
      local deadline=$((SECONDS + 30))
      until grep -q "$2" "$1" 2>/dev/null; do
        [ $SECONDS -lt $deadline ] || fail "timed out waiting for '$2' in $1"
        sleep 0.02
      done
    }
    wait_for_line interrupted.err "rank 0 hangs before step 25"
    kill -INT "$PID"
    wait_for_line interrupted.err "SIGINT: stopping with a checkpoint at the next step; SIGINT again stops at once"
    STAMP=$(date +%s.%N)
    kill -INT "$PID"
    finish interrupted
    sed 's/^/    /' interrupted.err
    [ "$RC" -eq 130 ] || fail "expected exit status 130 after a second SIGINT, got $RC"
    grep -q "second SIGINT: stopping at once" interrupted.err || fail "no line about the second SIGINT"
    [ ! -e "$SCRATCH/run/stopped.json" ] || fail "a run stopped at once wrote stopped.json"
    ;;

  checkpoint_full_disk)
    small=$SCRATCH/small
    mkdir -p "$small"
    if ! mount -t tmpfs -o size=1m dptrain_e2e_full "$small" 2>mount.err; then
      echo "SKIP: cannot mount a tmpfs here ($(cat mount.err)); needs root"
      exit 77
    fi
    trap 'umount "$small"' EXIT
    # The MLP with SGD momentum: 814 KB a checkpoint, so the first fits in 1 MiB and the second
    # cannot (the first is pruned only after the second is written).
    MLP=(mnist_mlp.json --set data.max_train_samples=2048 --set data.batch_size=32 --set training.epochs=1
         --set optimizer.type=sgd --set optimizer.momentum=0.9 --set checkpoint.every_steps=10
         --set "checkpoint.dir=\"$small\"")
    launch 2 full_stop "${MLP[@]}"
    sed 's/^/    /' full_stop.err | grep "dptrain:" | head -3
    [ "$RC" -ne 0 ] || fail "a checkpoint that cannot be written did not stop the run"
    grep -q "dptrain: error on rank 0: checkpoint of step 20: cannot write $small/ckpt-00000020.safetensors: .*No space left on device (ENOSPC)" full_stop.err ||
      fail "the error does not name the file and ENOSPC"
    [ "$(ls -A "$small" | grep -c tmp)" -eq 0 ] || fail "a temp file was left: $(ls -A "$small")"
    launch 1 evaluate_first "${MLP[@]}" --evaluate "$small/ckpt-00000010.safetensors"
    [ "$RC" -eq 0 ] || fail "the earlier checkpoint does not load: $(cat evaluate_first.err)"
    sed 's/^/  /' evaluate_first.out | tail -1
    rm -f "$small"/ckpt-*
    train 2 full_warn "${MLP[@]}" --set checkpoint.on_error=warn
    warnings=$(grep -c "warning: checkpoint of step .* not written: .*ENOSPC" full_warn.err)
    [ "$warnings" -ge 1 ] || fail "on_error warn printed no warning"
    echo "  on_error warn: finished with $warnings checkpoint warning(s); $(ls "$small" | tr '\n' ' ')"
    [ "$(ls -A "$small" | grep -c tmp)" -eq 0 ] || fail "a temp file was left: $(ls -A "$small")"
    # "warn" and a stop whose checkpoint cannot be written (the disk filled beforehand): the stop
    # still ends with 75, for a requeue, but says that no checkpoint was written, as stopped.json does.
    rm -f "$small"/ckpt-*
    head -c 1000000 /dev/zero >"$small/filler"
    DPTRAIN_INJECT_FAULT=0:0:slow:200 RUN_DIR=warn_stop start 2 warn_stop "${MLP[@]}" --set checkpoint.on_error=warn
    deadline=$((SECONDS + 60))
    until grep -q "warning: checkpoint of step 10 not written" warn_stop.err 2>/dev/null; do
      [ $SECONDS -lt $deadline ] || fail "no warning for step 10's checkpoint: $(cat warn_stop.err)"
      sleep 0.05
    done
    STAMP=$(date +%s.%N)
    kill -USR1 "$PID"
    finish warn_stop
    grep "stopped by" warn_stop.err | sed 's/^/    /'
    [ "$RC" -eq 75 ] || fail "expected exit status 75, got $RC"
    grep -q "NO checkpoint of this step is in $small; no checkpoint to resume from" warn_stop.err ||
      fail "the stop line does not say that its checkpoint was not written"
    grep -q '"checkpoint":null,"checkpoint_written":false' "$SCRATCH/warn_stop/stopped.json" ||
      fail "stopped.json does not say that no checkpoint was written: $(cat "$SCRATCH/warn_stop/stopped.json")"
    rm -f "$small/filler"
    # The same file system read-only: the run stops at start, where rank 0 locks checkpoint.dir.
    mount -o remount,ro "$small" || fail "could not remount the tmpfs read-only"
    launch 2 read_only "${MLP[@]}"
    grep "dptrain:" read_only.err | head -1 | sed 's/^/    /'
    [ "$RC" -ne 0 ] || fail "a read-only checkpoint.dir did not stop the run"
    grep -q "cannot create the lock file $small/.dptrain.lock: Read-only file system (EROFS)" read_only.err ||
      fail "the error does not name the directory and EROFS"
    ;;

  stop_at_epoch_end)
    # 2048 samples / (2 ranks x 32) = 32 steps an epoch, 2 epochs. Rank 0 sends itself SIGUSR1 before
    # step 32 (DPTRAIN_INJECT_FAULT kind sigusr1): the stop comes after the epoch's last step. The
    # resume starts at epoch 2, so epoch 1's evaluation and metrics line must come before the exit.
    MLP=(mnist_mlp.json --set data.max_train_samples=2048 --set data.max_test_samples=1000
         --set data.batch_size=32 --set training.epochs=2 --set checkpoint.every_epochs=0)
    train 2 straight "${MLP[@]}"
    DPTRAIN_INJECT_FAULT=0:31:sigusr1 RUN_DIR=run launch 2 stopped "${MLP[@]}"
    [ "$RC" -eq 75 ] || fail "expected exit status 75, got $RC: $(grep dptrain stopped.err)"
    grep -q '"global_step":32,' "$SCRATCH/run/stopped.json" || fail "not stopped after step 32: $(cat "$SCRATCH/run/stopped.json")"
    [ "$(grep -c . "$SCRATCH/run/metrics.jsonl")" -eq 1 ] && grep -q '"test_accuracy"' "$SCRATCH/run/metrics.jsonl" ||
      fail "epoch 1's metrics line, with its evaluation, is missing: $(cat "$SCRATCH/run/metrics.jsonl")"
    grep -q '^epoch 1: train loss .* | test loss ' stopped.out || fail "no line for epoch 1 with its test loss"
    echo "  stopped after step 32, the end of epoch 1: $(grep -m1 '^epoch 1: ' stopped.out)"
    RUN_DIR=run train 2 resumed "${MLP[@]}" --resume auto
    grep -q "resuming from .*ckpt-00000032.safetensors: step 32, epoch 2 at sample 0" resumed.out ||
      fail "did not resume at the start of epoch 2: $(grep resuming resumed.out)"
    [ "$(grep -c '"epoch":1,' "$SCRATCH/run/metrics.jsonl")" -eq 1 ] && [ "$(grep -c '"epoch":2,' "$SCRATCH/run/metrics.jsonl")" -eq 1 ] ||
      fail "metrics.jsonl does not hold epochs 1 and 2 once each: $(cat "$SCRATCH/run/metrics.jsonl")"
    cmp straight/model.safetensors run/model.safetensors || fail "resumed weights differ from the straight run's"
    echo "  resumed: epochs 1 and 2 in metrics.jsonl once each, weights bitwise identical to the straight run's"
    ;;

  output_dir_lock)
    # The holder trains for far longer than the test lasts (it is SIGKILLed below): a 2-epoch holder
    # could end within the second trainer's start-up (about 2 s in a Release build) and let it in.
    RUN_DIR=run start 1 holder "${RUN[@]}" --set training.epochs=1000
    holder=$PID
    wait_for "$SCRATCH/run/checkpoints/ckpt-00000020.safetensors"
    # On 2 ranks: rank 0 alone takes the lock, so rank 1 is still setting up (waiting for rank 0 in a
    # collective) when Open MPI's SIGTERM comes after rank 0's error. Before the first step that
    # ends it as by default, with no stop handler announcing a checkpoint.
    RUN_DIR=run launch 2 second "${RUN[@]}"
    sed 's/^/    /' second.err
    kill -0 "$holder" 2>/dev/null || fail "the holder ended before the second trainer was refused (test too short)"
    [ "$RC" -ne 0 ] || fail "a second trainer on the same output_dir was let in"
    grep -q "dptrain: error on rank 0: $SCRATCH/run is in use by another dptrain job (host .*, pid $holder, started " second.err ||
      fail "the refusal does not name the holder"
    ! grep -q "SIGTERM: stopping" second.err || fail "rank 1 announced a stop on Open MPI's SIGTERM before its first step"
    # A run of its own output_dir that names the holder's checkpoints as its checkpoint.dir: its fresh
    # start would remove them. The holder locked its checkpoint.dir too, inside its output_dir.
    RUN_DIR=other launch 1 borrower "${RUN[@]}" --set "checkpoint.dir=\"$SCRATCH/run/checkpoints\""
    [ "$RC" -ne 0 ] || fail "a run on the holder's checkpoint.dir was let in"
    grep -q "dptrain: error on rank 0: $SCRATCH/run/checkpoints is in use by another dptrain job (host .*, pid $holder" \
      borrower.err || fail "the refusal does not name the checkpoint.dir and the holder: $(cat borrower.err)"
    # (The holder prunes its own as it goes: that a given file is still there proves nothing.)
    ! grep -q "starting fresh: removed" borrower.out || fail "the refused run removed the holder's checkpoints"
    kill -9 "$holder"
    wait "$holder" 2>/dev/null || true
    # The third finishes epoch 1 (the sanitizer build: stops at once, the step limit already reached).
    third=(--set training.epochs=1)
    small && third+=(--set training.max_steps=1)
    RUN_DIR=run train 1 third "${RUN[@]}" "${third[@]}" --resume auto
    grep -h "no longer running" third.err | sed 's/^/    /'
    grep -q "$SCRATCH/run was locked by a job that is no longer running (host .*, pid $holder, .*); taking it over" third.err ||
      fail "the dead holder's lock was not taken over with a message"
    [ ! -e "$SCRATCH/run/.dptrain.lock" ] && [ ! -e "$SCRATCH/run/checkpoints/.dptrain.lock" ] ||
      fail "a lock file outlived the run"
    # checkpoint.dir spelled as output_dir with a trailing slash is the same directory, locked once
    # (a second lock on it would find this very run holding it).
    RUN_DIR=same train 1 same "${RUN[@]}" --set training.max_steps=1 --set "checkpoint.dir=\"$SCRATCH/same/\""
    ;;

  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
