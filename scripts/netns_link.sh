# Sourced by the network experiments (netns_scaling.sh, compression_netns.sh): two network
# namespaces joined by veth pairs through a bridge, Open MPI over TCP between them, and a tbf
# throttle per namespace. Expects $out (a directory for the launch agent). Defines MPI (the mpirun
# command line for 2 ranks across the namespaces), mpi OUTPUT CMD... (one retry) and throttle RATE;
# exits 77 with the reason when namespaces cannot be made, and removes them on exit.
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

# throttle RATE ("100mbit", "1gbit"): both namespaces' egress limited to RATE.
# Sets burst (bytes), which callers print.
throttle() {
  local rate=$1 bits
  # Burst: 10 ms at the rate (tbf needs at least rate / HZ; with a larger fixed burst, messages below
  # it would pass at full speed and the link would not behave like a link of that rate).
  bits=$(awk -v r="$rate" 'BEGIN { v = r + 0; print (r ~ /gbit/) ? v * 1e9 : (r ~ /mbit/) ? v * 1e6 : v * 1e3 }')
  burst=$(awk -v b="$bits" 'BEGIN { printf "%d", b / 8 / 100 }')
  for ns in "${NS[@]}"; do
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
  done
}
