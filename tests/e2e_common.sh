# Shared by the end-to-end scripts (tests/*/..._e2e.sh): arguments, helpers and the `train` runner.
# Sourced with the script's arguments: CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC].
set -u
CASE=$1 TRAINER=$2 SRC=$3 SCRATCH=$4 MPIEXEC=${5:-mpirun}
# tests/e2e_check.cpp, built beside the trainer: weight, metric and timeline comparisons.
CHECK=$(dirname "$TRAINER")/tests/e2e_check
# Real MNIST, where scripts/setup.sh put it.
MNIST_DIR=$(realpath -m "${DPTRAIN_DATA_DIR:-$SRC/data/mnist}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1  # with threads = 1 in every run: one core per rank, deterministic kernels

# DPTRAIN_E2E_SMALL=1 (set by ctest in the sanitizer build): each case at the smallest size that
# still drives its code path. Every launch then trains on the first 8192 training and evaluates on
# the first 1000 test samples unless the case says otherwise, and cases shrink their step counts
# with `pick FULL SMALL`; what only a full-size run shows (accuracy, speed) is guarded by `small ||`.
small() { [ "${DPTRAIN_E2E_SMALL:-0}" = 1 ]; }
pick() { if small; then echo "$2"; else echo "$1"; fi; }
SMALL_DATA=()
small && SMALL_DATA=(--set data.max_train_samples=8192 --set data.max_test_samples=1000)

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
cd "$SCRATCH" || exit 1

# Seconds since $1 (a `date +%s.%N` stamp), one decimal.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# The PIDs of $1's children, from /proc (procps, pgrep's package, is not on a minimal Debian).
children_of() {
  local stat
  for stat in /proc/[0-9]*/stat; do
    # Field 4 is the parent; the command name (field 2) may hold spaces, so count after its ')'.
    [ "$(sed 's/.*) //' "$stat" 2>/dev/null | cut -d' ' -f2)" = "$1" ] && basename "$(dirname "$stat")"
  done
}

fail() {
  echo "FAIL: $*"
  exit 1
}

# wait_for FILE [SECONDS]: until FILE exists (default 120 s), else fail.
wait_for() {
  local deadline=$((SECONDS + ${2:-120}))
  until [ -e "$1" ]; do
    [ $SECONDS -lt $deadline ] || fail "timed out waiting for $1"
    sleep 0.05
  done
}

need_mnist() {
  if [ ! -e "$MNIST_DIR/train-images-idx3-ubyte" ] && [ ! -e "$MNIST_DIR/train-images-idx3-ubyte.gz" ]; then
    echo "SKIP: $MNIST_DIR is absent (scripts/setup.sh fetches it)"
    exit 77
  fi
}

# launch NP NAME CONFIG [--set k=v | other trainer flags ...]: runs the trainer on NP ranks (1:
# without mpirun) with stdout and stderr in NAME.out / NAME.err, and sets RC to its exit status.
# Output goes to $SCRATCH/$RUN_DIR (default NAME): several launches can share one run directory.
# DPTRAIN_INJECT_FAULT, when set, reaches every rank.
launch() {
  local np=$1 name=$2 config=$3
  shift 3
  local cmd=("$TRAINER" --config "$SRC/configs/$config" --set "output_dir=\"$SCRATCH/${RUN_DIR:-$name}\""
             --set threads=1 --set "data.dir=\"$MNIST_DIR\"" "${SMALL_DATA[@]}" "$@")
  if [ "$np" -gt 1 ]; then
    cmd=("$MPIEXEC" -np "$np" --oversubscribe -x DPTRAIN_INJECT_FAULT "${cmd[@]}")
  fi
  local start=$(date +%s.%N)
  DPTRAIN_INJECT_FAULT=${DPTRAIN_INJECT_FAULT:-} "${cmd[@]}" >"$name.out" 2>"$name.err"
  RC=$?
  printf '  %-28s np %d  %5.1f s  exit %d\n' "$name" "$np" "$(since "$start")" "$RC"
}

# train NP NAME CONFIG [...]: launch, which must succeed and leave $SCRATCH/NAME/model.safetensors.
train() {
  launch "$@"
  local name=$2
  if [ "$RC" -ne 0 ]; then
    # From the top: Open MPI's start-up failures, the trainer's error line and a sanitizer's first
    # report all come first (the last 20 lines once hid why a singleton MPI_Init failed).
    echo "---- $name stderr (the first 60 of $(wc -l <"$name.err") lines) ----"
    head -60 "$name.err"
    fail "$name exited with $RC"
  fi
  [ -s "$SCRATCH/${RUN_DIR:-$name}/model.safetensors" ] || fail "$name wrote no model.safetensors"
}
