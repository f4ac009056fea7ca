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
#
# Needs root (ip netns, tc). Exits 77 with the reason when namespaces cannot be made. Removes its
# namespaces and bridge on exit.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rates="1gbit 100mbit" config=configs/mnist.json steps=20 out=runs/netns build=build allreduce_seconds=0.5
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2 ;;
    --config) config=$2 ;;
    --steps) steps=$2 ;;
    --out) out=$2 ;;
    --build) build=$2 ;;
    --allreduce-seconds) allreduce_seconds=$2 ;;
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
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

skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root for ip netns and tc"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip / tc missing (apt-get install iproute2)"

NS=(dptns1 dptns2) ADDR=(10.77.0.2 10.77.0.3) BRIDGE=dptbr0 SUBNET=10.77.0.0/24
cleanup() {
  for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
ip netns add "${NS[0]}" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
ip netns add "${NS[1]}"
ip link add "$BRIDGE" type bridge
ip addr add 10.77.0.1/24 dev "$BRIDGE"
ip link set "$BRIDGE" up
for i in 0 1; do
  ns=${NS[$i]}
  ip link add "v$ns" type veth peer name eth0 netns "$ns"
  ip link set "v$ns" master "$BRIDGE" up
  ip -n "$ns" addr add "${ADDR[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done
ip netns exec "${NS[0]}" bash -c "exec 3<>/dev/tcp/${ADDR[1]}/9" 2>/dev/null || true  # refused is fine: it resolves the neighbour
 ip -n "${NS[0]}" neigh show | grep -q "${ADDR[1]}" || skip "the namespaces cannot reach each other"

# mpirun starts the remote daemons through this agent, which enters the namespace named as the host.
agent=$out/netns-agent.sh
cat >"$agent" <<'EOF'
#!/bin/sh
host=$1
shift
exec ip netns exec "$host" /bin/sh -c "$*"
EOF
chmod +x "$agent"
MPI=(mpirun -np 2 -H "${NS[0]},${NS[1]}" --mca plm_rsh_agent "$agent" --mca btl tcp,self
     --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" --mca routed direct)

# Open MPI's start-up across the namespaces fails now and then (about one launch in 20 here, in its
# daemon routing); a failed launch is retried once, and said so.
mpi() {
  local output=$1
  shift
  "${MPI[@]}" "$@" >"$output" 2>&1 && return 0
  echo "  (mpirun failed, retrying once: $(grep -m1 -iE 'error|unable|not' "$output" || tail -1 "$output"))"
  "${MPI[@]}" "$@" >"$output" 2>&1 || { cat "$output"; return 1; }
}

echo "1-rank baseline (no network):"
"$build/bench/train_bench" --config "$config" --threads 1 --warmup 5 --steps "$steps" --reps 2 >"$out/np1.txt"
grep -E "^per step" "$out/np1.txt" | sed 's/^/  /'
for rate in $rates; do
  # Burst: 10 ms at the rate (tbf needs at least rate / HZ; with a larger fixed burst, messages below
  # it would pass at full speed and the link would not behave like a link of that rate).
  bits=$(awk -v r="$rate" 'BEGIN { v = r + 0; print (r ~ /gbit/) ? v * 1e9 : (r ~ /mbit/) ? v * 1e6 : v * 1e3 }')
  burst=$(awk -v b="$bits" 'BEGIN { printf "%d", b / 8 / 100 }')
  for ns in "${NS[@]}"; do
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
  done
  dir=$out/$rate
  mkdir -p "$dir"
  echo "== link throttled to $rate (tbf on each namespace's egress, burst $burst bytes)"
  mpi "$dir/allreduce.txt" "$build/bench/allreduce_bench" --max-mib 4 --seconds "$allreduce_seconds"
  grep -E "^(mnist_cnn|synthetic)" "$dir/allreduce.txt" | sed 's/^/  /'
  mpi "$dir/np2.txt" "$build/bench/train_bench" --config "$config" --threads 1 --warmup 3 --steps "$steps" --reps 2
  grep -E "median|^per step" "$dir/np2.txt" | sed 's/^/  /'
  grep -h '^RESULT' "$out/np1.txt" "$dir/np2.txt" >"$dir/results.jsonl"
  "$build/bench/scaling_model" --results "$dir/results.jsonl" --allreduce "$dir/allreduce.txt" \
    --label "netns, $rate" --link-gbit "$(awk -v r="$rate" 'BEGIN { v = r + 0; print (r ~ /gbit/) ? v : v / 1000 }')" \
    | tee "$dir/model.txt" | sed -n '1,/^largest/p' | sed 's/^/  /'
done
