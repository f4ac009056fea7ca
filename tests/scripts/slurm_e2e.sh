#!/usr/bin/env bash
# The trainer under a real Slurm (ctest: e2e_slurm): scripts/slurm_local.sh starts a private cluster
# of two nodes, scripts/slurm/train.sbatch is the batch script submitted, and every case ends with a
# model.safetensors byte-identical to one uninterrupted `mpirun -np 2` run of the same config.
#
#   slurm_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]      (CASE: slurm, all cases in turn)
#
#   srun          srun --mpi=pmix -N 1 -n 2 (one node) and -N 2 -n 2 (two nodes, over TCP): the ranks, the
#                 hosts and the progress lines the trainer reports, and the weights
#   time_limit    sbatch --time=1 --signal=USR1@60: the warning stops the job at an agreed step with a
#                 checkpoint and status 75, the script requeues it, it resumes and finishes
#   scancel_term  scancel --signal=TERM mid-run: the same
#   requeue       scontrol requeue mid-run: Slurm's SIGTERM, the same
#   kill          scancel --signal=KILL on the job's step (no warning): the job fails; requeued, it
#                 resumes from the last periodic checkpoint
#
# Exit 77 (skipped, saying why) without Slurm, root or MNIST; DPTRAIN_REQUIRE_SLURM=1 (CI) turns a
# missing Slurm or root into a failure. The cluster is stopped on every exit, failed or not, and a
# run first stops whatever a killed earlier run left.
source "$(dirname "$0")/../e2e_common.sh"
need_mnist

skip_or_fail() {
  if [ "${DPTRAIN_REQUIRE_SLURM:-0}" = 1 ]; then fail "$* (DPTRAIN_REQUIRE_SLURM=1)"; fi
  echo "SKIP: $*"
  exit 77
}
for cmd in slurmctld slurmd munged sbatch srun; do
  command -v "$cmd" >/dev/null || skip_or_fail "Slurm is not installed ($cmd not found; scripts/setup.sh --with-slurm installs it)"
done
[ "$(id -u)" = 0 ] || skip_or_fail "the two-node cluster needs root (network namespaces)"

CLUSTER=(bash "$SRC/scripts/slurm_local.sh")
CLUSTER_DIR=/tmp/dptrain-slurm-e2e
BATCH=$SRC/scripts/slurm/train.sbatch
"${CLUSTER[@]}" stop --dir "$CLUSTER_DIR" >/dev/null 2>&1 || true
trap '"${CLUSTER[@]}" stop --dir "$CLUSTER_DIR"' EXIT
trap 'exit 1' INT TERM  # (a signal's default action would skip the EXIT trap)
started=$(date +%s.%N)
"${CLUSTER[@]}" start --dir "$CLUSTER_DIR" || fail "the cluster did not start"
echo "  cluster up in $(since "$started") s"
eval "$("${CLUSTER[@]}" env --dir "$CLUSTER_DIR")"
export DPTRAIN_TRAINER=$TRAINER

# The MNIST CNN on 2 ranks, a checkpoint every 20 steps, all kept (with the default keep=3 a job
# that ran ahead while the test watched another had already pruned the checkpoint it waited for):
# 128 steps per epoch, 2 epochs (about 4 s here).
COMMON=(--set threads=1 --set "data.dir=\"$MNIST_DIR\"" --set data.max_test_samples=500
        --set data.batch_size=32 --set checkpoint.every_steps=20 --set checkpoint.every_epochs=0
        --set checkpoint.keep=0)
SHORT=("${COMMON[@]}" --set data.max_train_samples=8192 --set training.epochs=2)
CONFIG=$SRC/configs/mnist.json

# reference NAME RUN: the uninterrupted run under mpirun, in $SCRATCH/NAME.
reference() {
  local -n run=$2
  "$MPIEXEC" -np 2 --oversubscribe "$TRAINER" --config "$CONFIG" --set "output_dir=\"$SCRATCH/$1\"" "${run[@]}" \
    >"$1.out" 2>&1 || { tail -n 5 "$1.out"; fail "the mpirun reference run $1 failed"; }
}

# same_weights NAME REFERENCE: NAME's final weights are the reference run's, byte for byte.
same_weights() {
  [ -e "$SCRATCH/$1/model.safetensors" ] || fail "$1: no model.safetensors"
  cmp -s "$SCRATCH/$2/model.safetensors" "$SCRATCH/$1/model.safetensors" ||
    fail "$1: model.safetensors differs from the uninterrupted mpirun run's ($2)"
  echo "  $1: model.safetensors byte-identical to mpirun -np 2's"
}

job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -1 | cut -d= -f2; }

# wait_job ID STATE [SECONDS]: until job ID is in STATE (a regex), else fail showing its output.
wait_job() {
  local deadline=$((SECONDS + ${3:-60})) state
  until state=$(job_field "$1" JobState) && [[ "$state" =~ ^($2)$ ]]; do
    if [ $SECONDS -ge "$deadline" ]; then
      scontrol show job "$1" | head -5
      tail -n 5 "$SCRATCH"/*.job.out 2>/dev/null
      fail "job $1 is $state, not $2, after ${3:-60} s"
    fi
    sleep 0.2
  done
}

# submit NAME RUN [sbatch options]: the batch script on 2 tasks of one node; JOB holds its id. The
# output (appended to across requeues) is NAME.job.out.
submit() {
  local name=$1
  local -n run=$2
  shift 2
  JOB=$(sbatch --parsable --nodes=1 --ntasks=2 --output="$SCRATCH/$name.job.out" "$@" "$BATCH" "$CONFIG" \
        --set "output_dir=\"$SCRATCH/$name\"" "${run[@]}") || fail "$name: sbatch failed"
}

# finished_after_requeue NAME STOPPED_BY REFERENCE: the job ran twice (Restarts=1), the first run
# stopped by STOPPED_BY with a checkpoint and status 75, the second resumed from it, and the weights
# are the reference run's.
finished_after_requeue() {
  local name=$1 stopped_by=$2 reference=$3 out="$SCRATCH/$1.job.out"
  wait_job "$JOB" COMPLETED 90
  local restarts
  restarts=$(job_field "$JOB" Restarts)
  [ "$restarts" = 1 ] || fail "$name: Restarts=$restarts, expected 1"
  grep -q "dptrain job $JOB: start 2" "$out" || fail "$name: the output shows no second start"
  local stop_line
  stop_line=$(grep -m1 "dptrain: stopped by" "$out") || fail "$name: no checkpointed stop in the output"
  [[ "$stop_line" == *"stopped by $stopped_by"* ]] || fail "$name: $stop_line (expected $stopped_by)"
  echo "  $name: ${stop_line#dptrain: }"
  grep -m1 "dptrain: resuming from" "$out" | sed 's/^dptrain: /    /'
  same_weights "$name" "$reference"
}

# --- srun, one node and two
case_srun() {
  reference reference_short SHORT
  local layout hosts args name
  for layout in "1 -N 1 -n 2" "2 -N 2 -n 2"; do
    hosts=${layout%% *} args=${layout#* } name=srun_${hosts}host
    # shellcheck disable=SC2086  # args: srun's options
    srun --mpi=pmix $args "$TRAINER" --config "$CONFIG" --set "output_dir=\"$SCRATCH/$name\"" "${SHORT[@]}" \
      >"$name.out" 2>"$name.err" || { tail -n 5 "$name.out" "$name.err"; fail "srun --mpi=pmix $args failed"; }
    grep -q "dptrain: 2 rank(s) on $hosts host(s)" "$name.out" ||
      fail "srun $args: expected '2 rank(s) on $hosts host(s)', got: $(grep -m1 'rank(s) on' "$name.out")"
    # Under Slurm progress prints plain lines (no carriage returns), one per 100 steps.
    ! grep -q $'\r' "$name.out" || fail "srun $args: progress used carriage returns under Slurm"
    grep -q "^epoch 2/2 step 100/128" "$name.out" || fail "srun $args: no progress lines"
    echo "  srun --mpi=pmix $args: $(grep -m1 -o '2 rank(s) on [0-9] host(s)' "$name.out"), progress in lines"
    same_weights "$name" reference_short
  done
}

# --- time_limit. Slurm checks time limits every 30 s from slurmctld's start, and sends the
# --signal warning at the first check that finds the job within its warning time: with USR1@60 and a
# one-minute limit, at the first check after the job starts. The job is submitted 3.5 s before a
# check, so that the warning comes early in its training, and it must still be training then, on
# any machine: rank 0 sleeps 20 ms before each step (DPTRAIN_INJECT_FAULT kind slow; the ranks keep
# in step), so at most 150 of its 256 steps pass in the 3 s (4 epochs without the sleeps, 1,536
# steps, took 2.8 s on a 2-core AMD EPYC VM and ended first; 24 s on another day).
CTLD_START=$(date -d "$(sed -n 's/^\[\([^]]*\)\] slurmctld version .* started.*/\1/p' "$CLUSTER_DIR/log/slurmctld.log" | tail -1)" +%s.%N)
# The next check at least 4 s away.
next_check() {
  awk -v s="$CTLD_START" -v now="$(date +%s.%N)" \
    'BEGIN { k = int((now - s) / 30) + 1; while (s + 30 * k - now < 4) k++; printf "%.3f", s + 30 * k }'
}
seconds_until() { awk -v t="$1" -v now="$(date +%s.%N)" 'BEGIN { printf "%.3f", t - now }'; }

case_time_limit() {
  local attempt check
  for attempt in 1 2; do
    check=$(next_check)
    sleep "$(awk -v left="$(seconds_until "$check")" 'BEGIN { printf "%.3f", left - 3.5 }')"
    rm -rf "$SCRATCH/time_limit" "$SCRATCH/time_limit.job.out"
    submit time_limit SHORT --time=1 --signal=USR1@60 --export=ALL,DPTRAIN_INJECT_FAULT=0:0:slow:20
    # The job must be running a second before the check it was aimed at (the ranks need that long to
    # install their handlers); one that started after it would get the warning 30 s later, after it
    # had finished. Then it goes again, aimed at the next check.
    until [ "$(job_field "$JOB" JobState)" != PENDING ] ||
      awk -v left="$(seconds_until "$check")" 'BEGIN { exit !(left <= 1) }'; do sleep 0.1; done
    [ "$(job_field "$JOB" JobState)" != PENDING ] && break
    echo "  time_limit: job $JOB had not started a second before the time-limit check it was aimed at"
    scancel "$JOB"
    [ $attempt = 2 ] && fail "time_limit: twice the job did not start within 2.5 s of its submission"
  done
  # Requeued, the job keeps its one-minute limit, whose warning every check sends: the resumed run
  # would have to finish before the next check, 30 s after the first (with 1,536 steps, on a Zen 3
  # VM at 21 ms a step, it did not, and was stopped again: Restarts=2). A real limit is hours long;
  # here the requeued job gets ten minutes, which no check comes within.
  local deadline=$((SECONDS + 60))
  until [ "$(job_field "$JOB" Restarts)" -ge 1 ] 2>/dev/null; do
    [ $SECONDS -ge $deadline ] && fail "time_limit: job $JOB was not requeued within 60 s of the warning"
    sleep 0.1
  done
  scontrol update JobId="$JOB" TimeLimit=10 || fail "time_limit: scontrol update JobId=$JOB TimeLimit=10 failed"
  finished_after_requeue time_limit SIGUSR1 reference_short
  grep -m1 "^JobId=$JOB .*JobState=PENDING" "$CLUSTER_DIR/log/jobcomp.txt" >/dev/null ||
    fail "time_limit: the job completion log has no requeue record for job $JOB"
  echo "    the job completion log: $(grep "^JobId=$JOB " "$CLUSTER_DIR/log/jobcomp.txt" | grep -o 'JobState=[A-Z]*' | paste -sd' ')"
}

# --- scancel_term and requeue: a signal mid-run, once the step-40 checkpoint exists. The two jobs
# run side by side, one on each node, so that their waits to start again overlap; one loop watches
# both, since either may start first (waiting for one, then the other, let the other finish first).
case_scancel_term_and_requeue() {
  submit scancel_term SHORT --nodelist=n1
  local scancelled=$JOB
  submit requeue SHORT --nodelist=n2
  local requeued=$JOB
  local ckpt=checkpoints/ckpt-00000040.safetensors term_sent="" requeue_sent=""
  local deadline=$((SECONDS + 120))
  until [ -n "$term_sent" ] && [ -n "$requeue_sent" ]; do
    if [ -z "$term_sent" ] && [ -e "$SCRATCH/scancel_term/$ckpt" ]; then
      scancel --signal=TERM "$scancelled" && term_sent=1
    fi
    if [ -z "$requeue_sent" ] && [ -e "$SCRATCH/requeue/$ckpt" ]; then
      scontrol requeue "$requeued" && requeue_sent=1
    fi
    [ $SECONDS -lt $deadline ] || fail "no step-40 checkpoint after 120 s (scancel_term: ${term_sent:-none}, requeue: ${requeue_sent:-none})"
    sleep 0.05
  done
  JOB=$scancelled finished_after_requeue scancel_term SIGTERM reference_short
  JOB=$requeued finished_after_requeue requeue SIGTERM reference_short
}

# --- kill: SIGKILL to the step's tasks, as the OOM killer or a dying node would. (`scancel
# --signal=KILL JOB`, without the step, is a cancel in Slurm 22.05: SIGTERM first, KillWait, then
# SIGKILL, as the requeue case.)
case_kill() {
  submit kill SHORT
  wait_for "$SCRATCH/kill/checkpoints/ckpt-00000060.safetensors"
  scancel --signal=KILL "$JOB.0"
  wait_job "$JOB" FAILED 30
  echo "  kill: the job $(job_field "$JOB" JobState) with exit code $(job_field "$JOB" ExitCode) (no checkpoint at the kill)"
  ! grep -q "dptrain: stopped by" "$SCRATCH/kill.job.out" || fail "kill: the ranks stopped with a checkpoint; SIGKILL allows none"
  scontrol requeue "$JOB"
  wait_job "$JOB" COMPLETED 90
  local resumed step
  resumed=$(grep -m1 "dptrain: resuming from" "$SCRATCH/kill.job.out") || fail "kill: the requeued job did not resume"
  step=$(echo "$resumed" | sed -n 's/.*ckpt-0*\([0-9]*\)\.safetensors.*/\1/p')
  [ $((step % 20)) = 0 ] && [ "$step" -ge 60 ] || fail "kill: resumed from step $step, not a periodic checkpoint (every 20) at or after 60"
  echo "  kill: requeued, ${resumed#dptrain: }"
  same_weights kill reference_short
}

case_srun
# The other cases (about 10 s each, the requeues' waits included) fill the wait for the time-limit
# check that the time_limit case aims at: kill first, after which the first check (30 s after
# slurmctld's start) is often still in reach.
pending=(kill scancel_term_and_requeue)
while [ ${#pending[@]} -gt 0 ] && awk -v left="$(seconds_until "$(next_check)")" 'BEGIN { exit !(left > 15) }'; do
  "case_${pending[0]}"
  pending=("${pending[@]:1}")
done
case_time_limit
for name in "${pending[@]}"; do "case_$name"; done
echo "  all cases: $(since "$started") s from the cluster's start"
