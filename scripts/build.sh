#!/usr/bin/env bash
# Configures and builds dptrain: scripts/build.sh [build-dir] [extra cmake args...]
# Defaults: build/ as a Release build. Uses 2 parallel jobs unless DPTRAIN_JOBS says otherwise.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-$repo_root/build}"
shift || true
cmake -S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "${DPTRAIN_JOBS:-2}"
