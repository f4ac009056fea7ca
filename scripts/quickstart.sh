#!/usr/bin/env bash
# Quick start: installs what is missing, builds the `trainer` program alone (Release; no tests, no
# benchmarks) and trains the MNIST CNN (configs/mnist.json) on 2 ranks with mpirun. DPTRAIN_NP=N
# picks another number of ranks, DPTRAIN_DATA_DIR another place for MNIST (as scripts/setup.sh);
# extra arguments go to the trainer, e.g.
#   scripts/quickstart.sh --set training.epochs=1
# The CUDA backend is compiled only where a GPU is usable or the arguments ask for device "cuda"
# (a build directory configured before keeps its own choice).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A relative DPTRAIN_DATA_DIR from where the script was started, for setup.sh and the trainer alike.
[[ -n ${DPTRAIN_DATA_DIR:-} ]] && export DPTRAIN_DATA_DIR="$(realpath -m "$DPTRAIN_DATA_DIR")"
cd "$repo_root"
began=$(date +%s)
scripts/setup.sh
cmake_args=()
if [[ ! -f build/CMakeCache.txt ]]; then
  cuda=OFF
  if { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; } || [[ "$*" == *device=*cuda* ]]; then
    cuda=AUTO
  fi
  cmake_args+=(-DDPTRAIN_CUDA="$cuda")
fi
echo "== building build/trainer =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >/dev/null
cmake --build build -j "${DPTRAIN_JOBS:-2}" --target trainer
np="${DPTRAIN_NP:-2}"
launch=(mpirun -np "$np")
((EUID == 0)) && launch+=(--allow-run-as-root)               # Open MPI refuses root without it
((np > $(nproc))) && launch+=(--oversubscribe)                # more ranks than cores
trainer_args=(--config configs/mnist.json)
[[ -n ${DPTRAIN_DATA_DIR:-} ]] && trainer_args+=(--set "data.dir=\"$DPTRAIN_DATA_DIR\"")
trainer_args+=("$@")
echo "== training configs/mnist.json on $np ranks: ${launch[*]} build/trainer ${trainer_args[*]} =="
"${launch[@]}" build/trainer "${trainer_args[@]}"
echo "== quick start done in $(($(date +%s) - began)) s =="
