#!/usr/bin/env bash
# Quick start: installs what is missing, builds (Release) and trains the MNIST CNN (configs/mnist.json)
# on 2 ranks with mpirun. DPTRAIN_NP=N picks another number of ranks; extra arguments go to the
# trainer, e.g. scripts/quickstart.sh --set training.epochs=1
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
scripts/setup.sh
scripts/build.sh build
np="${DPTRAIN_NP:-2}"
launch=(mpirun -np "$np")
((EUID == 0)) && launch+=(--allow-run-as-root)               # Open MPI refuses root without it
((np > $(nproc))) && launch+=(--oversubscribe)                # more ranks than cores
echo "== training configs/mnist.json on $np ranks: ${launch[*]} build/trainer --config configs/mnist.json $* =="
"${launch[@]}" build/trainer --config configs/mnist.json "$@"
