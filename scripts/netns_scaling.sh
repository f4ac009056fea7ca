#!/usr/bin/env bash
# Validates the scaling model's network term where the network is the bottleneck: two ranks in
# separate network namespaces joined by veth pairs through a bridge, Open MPI over TCP only, each
# namespace's link throttled with `tc qdisc ... tbf` (netem is not available on these kernels, so
# latency is whatever the measurement shows). For each rate: bench/allreduce_bench over the link
# (alpha, bandwidth), the trainer's step at 1 rank and at 2 ranks across the link, and
# build/bench/scaling_model's prediction against the measurement.
#
#   scripts/netns_scaling.sh [--rates "1gbit 100mbit"] [--config configs/mnist.json] [--steps 20]
#                            [--out runs/netns] [--build build] [--allreduce-seconds 0.5]
#                            [--set KEY=VALUE ...]
#
# --set overrides the config in every run (repeatable). Relative paths are taken from the current
# directory.
#
# Needs root (ip netns, tc). Exits 77 with the reason when namespaces cannot be made. Removes its
# namespaces and bridge on exit.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A path given relative, from the directory the script was started in (the defaults are the
# repository's, where the script then works).
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
rates="1gbit 100mbit" config=configs/mnist.json steps=20 out=runs/netns build=build allreduce_seconds=0.5
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) ;;
    -*) [ $# -ge 2 ] || { echo "netns_scaling.sh: $1 needs a value (--help lists the options)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --rates) rates=$2 ;;
    --config) config=$(absolute "$2") ;;
    --steps) steps=$2 ;;
    --out) out=$(absolute "$2") ;;
    --build) build=$(absolute "$2") ;;
    --allreduce-seconds) allreduce_seconds=$2 ;;
    --set) overrides+=(--set "$2") ;;
    -h | --help) sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "netns_scaling.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
cd "$repo_root"
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)     # the daemons in the namespaces start from another directory
config=$(realpath "$config")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

source "$repo_root/scripts/netns_link.sh"
for rate in $rates; do check_rate "$rate"; done

echo "1-rank baseline (no network):"
"$build/bench/train_bench" --config "$config" "${overrides[@]}" --threads 1 --warmup 5 --steps "$steps" --reps 2 \
  >"$out/np1.txt"
grep -E "^per step" "$out/np1.txt" | sed 's/^/  /'
for rate in $rates; do
  throttle "$rate"
  dir=$out/$rate
  mkdir -p "$dir"
  echo "== link throttled to $rate (tbf on each namespace's egress, burst $burst bytes)"
  mpi "$dir/allreduce.txt" "$build/bench/allreduce_bench" --max-mib 4 --seconds "$allreduce_seconds"
  grep -E "^(mnist_cnn|synthetic)" "$dir/allreduce.txt" | sed 's/^/  /'
  mpi "$dir/np2.txt" "$build/bench/train_bench" --config "$config" "${overrides[@]}" --threads 1 --warmup 3 \
    --steps "$steps" --reps 2
  grep -E "median|^per step" "$dir/np2.txt" | sed 's/^/  /'
  grep -h '^RESULT' "$out/np1.txt" "$dir/np2.txt" >"$dir/results.jsonl"
  "$build/bench/scaling_model" --results "$dir/results.jsonl" --allreduce "$dir/allreduce.txt" \
    --label "netns, $rate" --link-gbit "$(awk -v r="$rate" 'BEGIN { v = r + 0; print (r ~ /gbit/) ? v : (r ~ /mbit/) ? v / 1e3 : v / 1e6 }')" \
    | tee "$dir/model.txt" | sed -n '1,/^largest/p' | sed 's/^/  /'
done
