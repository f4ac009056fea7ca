#!/usr/bin/env bash
# Quick start: installs what is missing, builds (Release) and trains the MNIST CNN (configs/mnist.json).
# Extra arguments go to the trainer, e.g. scripts/quickstart.sh --set training.epochs=1
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
scripts/setup.sh
scripts/build.sh build
echo "== training configs/mnist.json =="
build/trainer --config configs/mnist.json "$@"
