#!/usr/bin/env bash
# Configures and builds dptrain, everything (trainer, tests, benchmarks, export_dataset), installing
# nothing (scripts/setup.sh installs the packages):
#
#   scripts/build.sh [BUILD_DIR] [CMAKE_ARGS...]
#
# Defaults: build/ as a Release build. Uses 2 parallel jobs unless DPTRAIN_JOBS says otherwise.
# E.g. scripts/build.sh build-avx2 -DDPTRAIN_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=haswell
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
[[ ${1:-} == -* ]] && { echo "build.sh: the first argument is the build directory, not '$1' (try --help)" >&2; exit 2; }
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-$repo_root/build}"
shift || true
cmake -S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "${DPTRAIN_JOBS:-2}"
