# Sourced by the network experiments (netns_scaling.sh, compression_netns.sh): two network
# namespaces joined by veth pairs through a bridge, Open MPI over TCP between them, and a tbf
# throttle per namespace. Expects $out (a directory for the launch agent). Defines MPI (the mpirun
# command line for 2 ranks across the namespaces), mpi OUTPUT CMD... (one retry) and throttle RATE;
# exits 77 with the reason when namespaces cannot be made, and removes them (and the daemons' session
# directories and the agent) on exit.
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root for ip netns and tc"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip / tc missing (apt-get install iproute2)"

NS=(dptns1 dptns2) ADDR=(10.77.0.2 10.77.0.3) BRIDGE=dptbr0 SUBNET=10.77.0.0/24
cleanup() {
  # A namespace outlives its deletion while a process is still inside (an orphaned daemon of a killed
  # run); the host ends of its veth pairs then block the next set-up, so they go explicitly.
  for ns in "${NS[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    ip link del "v$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "/tmp/dptrain-netns-${NS[0]}" "/tmp/dptrain-netns-${NS[1]}" "$out/netns-agent.sh"
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

# mpirun starts the remote daemons through this agent, which enters the namespace named as the host
# and gives each namespace a core of its own, as two hosts would have: left to Open MPI, each daemon
# binds its first rank to core 0, both ranks share that core and every step's compute doubles. It
# also gives each its own directory for Open MPI's session files: the namespaces share the host's
# name and /tmp, and two daemons creating the same session directory at once failed a launch now and
# then ("A call to mkdir was unable to create the desired directory: File exists").
agent=$out/netns-agent.sh
cat >"$agent" <<EOF
#!/bin/sh
host=\$1
shift
case "\$host" in
  ${NS[0]}) core=0 ;;
  *) core=$(($(nproc) - 1)) ;;
esac
sessions=/tmp/dptrain-netns-\$host
mkdir -p "\$sessions"
exec ip netns exec "\$host" env OMPI_MCA_orte_tmpdir_base="\$sessions" taskset -c "\$core" /bin/sh -c "\$*"
EOF
chmod +x "$agent"
# rtc_hwloc_vmhole none: the daemons do not share their hwloc topology through a segment mapped at a
# guessed hole in their address space; with it, a daemon crashed now and then (SIGSEGV in
# hwloc_shmem_topology_write, about one launch in 20).
MPI=(mpirun -np 2 -H "${NS[0]},${NS[1]}" --bind-to none --mca plm_rsh_agent "$agent" --mca btl tcp,self
     --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" --mca routed direct
     --mca rtc_hwloc_vmhole none)

# A launch that fails all the same is retried once, and said so. Its output stays beside the
# retry's (OUTPUT.failed), to tell a launch failure from a crash of the program.
mpi() {
  local output=$1
  shift
  "${MPI[@]}" "$@" >"$output" 2>&1 && return 0
  mv "$output" "$output.failed"
  echo "  (mpirun failed, retrying once; its output: $output.failed: $(grep -m1 -iE 'error|unable|not' "$output.failed" || tail -1 "$output.failed"))"
  "${MPI[@]}" "$@" >"$output" 2>&1 || { cat "$output"; return 1; }
}

# check_rate RATE: a number and kbit, mbit or gbit (tc's units, which the model's conversions read),
# else exit 2 with one line.
check_rate() {
  [[ $1 =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] ||
    { echo "netns: link rate '$1': give a number and kbit, mbit or gbit (100mbit, 1gbit)" >&2; exit 2; }
}

# throttle RATE ("100mbit", "1gbit"): both namespaces' egress limited to RATE.
# Sets burst (bytes), which callers print.
throttle() {
  local rate=$1 bits
  check_rate "$rate"
  # Burst: 10 ms at the rate (tbf needs at least rate / HZ; with a larger fixed burst, messages below
  # it would pass at full speed and the link would not behave like a link of that rate).
  bits=$(awk -v r="$rate" 'BEGIN { v = r + 0; print (r ~ /gbit/) ? v * 1e9 : (r ~ /mbit/) ? v * 1e6 : v * 1e3 }')
  burst=$(awk -v b="$bits" 'BEGIN { printf "%d", b / 8 / 100 }')
  for ns in "${NS[@]}"; do
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
  done
}
