#!/usr/bin/env bash
# A private Slurm cluster on this machine, for the tests and for trying the batch scripts: its own
# munge key and socket, slurm.conf, state and logs in one directory, slurmctld and two slurmd.
#
#   scripts/slurm_local.sh start  [--nodes 1|2] [--dir DIR]   then: eval "$(scripts/slurm_local.sh env)"
#   scripts/slurm_local.sh env    [--dir DIR]   the variables that point Slurm's commands and Open MPI at it
#   scripts/slurm_local.sh status [--dir DIR]   its daemons, sinfo and squeue
#   scripts/slurm_local.sh stop   [--dir DIR]   ends its jobs, daemons and namespaces; nothing is left
#
# DIR: $DPTRAIN_SLURM_DIR, else /tmp/dptrain-slurm. As root (slurmd runs jobs as their users). Two
# nodes (the default): each slurmd in a network namespace of its own (n1 at 10.78.0.2, n2 at .3,
# slurmctld on the bridge at .1), so `srun -N 2` crosses a link as between two hosts; --nodes 1: one
# slurmd on 127.0.0.1, where namespaces cannot be made. Ports 16817/16818 instead of 6817/6818, and
# nothing under /etc: a Slurm configured on the machine is left alone. Debian's slurmctld, slurmd,
# slurm-client and munge: scripts/setup.sh --with-slurm.
set -euo pipefail

action=${1:-}
[[ $# -gt 0 ]] && shift
dir=${DPTRAIN_SLURM_DIR:-/tmp/dptrain-slurm}
nodes=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    --nodes) nodes=${2:?--nodes needs 1 or 2}; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm_local.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ "$nodes" == 1 || "$nodes" == 2 ]] || { echo "slurm_local.sh: --nodes takes 1 or 2, not '$nodes'" >&2; exit 2; }
dir=$(realpath -m "$dir")

NS=(dptslurm1 dptslurm2) NODE_ADDR=(10.78.0.2 10.78.0.3) BRIDGE=dptslurmbr CTL_ADDR=10.78.0.1
SUBNET=10.78.0.0/24 CTL_PORT=16817 NODE_PORT=16818
conf=$dir/slurm.conf
export SLURM_CONF=$conf

die() {
  echo "slurm_local.sh: $*" >&2
  exit 1
}

# die_with_log LOG MESSAGE: die, after the last lines of the daemon's log.
die_with_log() {
  local log=$1
  shift
  [[ -e $log ]] && tail -n 5 "$log" | sed 's/^/  /' >&2
  die "$* (log: $log)"
}

# alive PIDFILE: the daemon the file names is running (a zombie is not: where PID 1 is slow to reap
# them, a daemon that has exited stays one for a while).
alive() {
  [[ -s "$1" ]] || return 1
  local pid
  pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null && [[ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]]
}

# stop_pid PIDFILE: SIGTERM, up to 10 s, then SIGKILL.
stop_pid() {
  if alive "$1"; then
    local pid
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do alive "$1" || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

write_conf() {
  local ctl_addr=127.0.0.1 cpus
  [[ $nodes == 2 ]] && ctl_addr=$CTL_ADDR
  cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc, which follows OMP_NUM_THREADS
  cat >"$conf" <<EOF
# A private test cluster written by scripts/slurm_local.sh; every path is under $dir.
ClusterName=dptrain
SlurmctldHost=$(hostname -s)($ctl_addr)
SlurmctldPort=$CTL_PORT
SlurmdPort=$NODE_PORT
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
# No cgroups: processes are tracked by parentage and tasks are not bound, as on a VM without them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# Pending jobs (a requeued one among them) are looked at every second, not every minute.
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Every end of a job, requeues included, is a line here (sacct needs slurmdbd, which this has not).
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
EOF
  if [[ $nodes == 2 ]]; then
    echo "NodeName=n1 NodeAddr=${NODE_ADDR[0]} CPUs=$cpus State=UNKNOWN" >>"$conf"
    echo "NodeName=n2 NodeAddr=${NODE_ADDR[1]} CPUs=$cpus State=UNKNOWN" >>"$conf"
  else
    echo "NodeName=n1 NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN" >>"$conf"
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$conf"
}

remove_namespaces() {
  for ns in "${NS[@]}"; do
    # A namespace outlives its deletion while a process is inside: end them first.
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086  # a list of pids
    [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    ip link del "v$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

make_namespaces() {
  command -v ip >/dev/null || die "ip not found (apt-get install iproute2), or --nodes 1"
  local ns pids
  for ns in "${NS[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -z "$pids" ]] || die "network namespace $ns is in use by another cluster (pids $pids): stop it first" \
      "(scripts/slurm_local.sh stop --dir <its directory>)"
  done
  remove_namespaces
  ip netns add "${NS[0]}" 2>/dev/null || die "cannot make network namespaces here (ip netns add failed); --nodes 1 runs without them"
  ip netns add "${NS[1]}"
  ip link add "$BRIDGE" type bridge
  ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in 0 1; do
    ns=${NS[$i]}
    ip link add "v$ns" type veth peer name eth0 netns "$ns"
    ip link set "v$ns" master "$BRIDGE" up
    ip -n "$ns" addr add "${NODE_ADDR[$i]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  touch "$dir/run/namespaces"
}

# start_slurmd NAME [NETNS]: slurmd for node NAME (inside NETNS when given), in a mount namespace of
# its own: where /sys/fs/cgroup is not mounted (a chroot), a cgroup v1 layout goes there (a tmpfs and
# an empty hierarchy of the cluster's own as the "systemd" one), since Debian's slurmd 22.05 will not
# start without one even when, as here, no plugin uses it; and the namespace tells `stop` which
# processes were the node's. Each node reads its own copy of
# slurm.conf beside an mpi.conf of its own: PMIx names its per-step client directory by user, job
# and step alone, under /tmp unless told, and the two nodes' would collide there.
start_slurmd() {
  local name=$1 ns=${2:-} enter=()
  mkdir -p "$dir/spool/$name" "$dir/node/$name" "$dir/tmp/$name"
  cp "$conf" "$dir/node/$name/slurm.conf"
  echo "PMIxCliTmpDirBase=$dir/tmp/$name" >"$dir/node/$name/mpi.conf"
  [[ -n $ns ]] && enter=(nsenter --net="/run/netns/$ns")
  # shellcheck disable=SC2016  # expanded by the inner shell
  "${enter[@]}" unshare --mount --propagation private sh -ec '
    case "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" in
      cgroup2fs | tmpfs) ;;
      *)
        mount -t tmpfs -o mode=755 dptrain-cgroup /sys/fs/cgroup
        mkdir /sys/fs/cgroup/systemd
        mount -t cgroup -o none,name=dptrain-slurm dptrain-cgroup /sys/fs/cgroup/systemd
        ;;
    esac
    exec slurmd -f "$1" -N "$2"' sh "$dir/node/$name/slurm.conf" "$name" ||
    die_with_log "$dir/log/slurmd-$name.log" "slurmd $name did not start"
  # slurmd writes its pid file after it has forked into the background.
  local pidfile=$dir/run/slurmd-$name.pid
  for _ in $(seq 100); do alive "$pidfile" && break; sleep 0.05; done
  alive "$pidfile" || die_with_log "$dir/log/slurmd-$name.log" "slurmd $name did not stay up"
  readlink "/proc/$(cat "$pidfile")/ns/mnt" >"${pidfile%.pid}.mntns"
}

start() {
  local cmd
  for cmd in munged slurmctld slurmd sinfo unshare nsenter; do
    command -v "$cmd" >/dev/null || die "$cmd not found: scripts/setup.sh --with-slurm installs Slurm and munge from Debian"
  done
  ((EUID == 0)) || die "run as root: slurmd starts every job as its user"
  if alive "$dir/run/slurmctld.pid"; then
    echo "slurm_local: already running in $dir"
    return 0
  fi
  stop >/dev/null  # whatever a killed earlier start left
  # A start that fails takes down what it had started.
  trap 'rc=$?; ((rc == 0)) || { echo "slurm_local: start failed; stopping what it started" >&2; stop >/dev/null 2>&1; }' EXIT
  mkdir -p "$dir"/{munge,state,spool,run,log}
  # munged refuses a key that others can read and a socket directory they cannot enter.
  chmod 755 "$dir/munge"
  [[ -s "$dir/munge/munge.key" ]] || head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 600 "$dir/munge/munge.key"
  write_conf
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" ||
    die_with_log "$dir/log/munged.log" "munged did not start"
  [[ $nodes == 2 ]] && make_namespaces
  # -c: a fresh cluster, without the jobs of an earlier one in the state directory.
  slurmctld -c -f "$conf" || die_with_log "$dir/log/slurmctld.log" "slurmctld did not start"
  if [[ $nodes == 2 ]]; then
    start_slurmd n1 "${NS[0]}"
    start_slurmd n2 "${NS[1]}"
  else
    start_slurmd n1
  fi
  local deadline=$((SECONDS + 30))
  until [[ "$(sinfo -h -o '%t' 2>/dev/null | sort -u)" == idle ]]; do
    if ((SECONDS >= deadline)); then
      sinfo >&2 || true
      tail -n 5 "$dir"/log/*.log >&2 || true
      die "the nodes did not become idle within 30 s (logs: $dir/log)"
    fi
    sleep 0.1
  done
  trap - EXIT
  echo "slurm_local: $(sinfo -h -o '%D node(s) %t: %N') in $dir; eval \"\$($0 env --dir $dir)\""
}

env_lines() {
  echo "export SLURM_CONF=$conf"
  # Open MPI's TCP transport between the nodes: only the cluster's subnet routes between them.
  [[ -e "$dir/run/namespaces" ]] && echo "export OMPI_MCA_btl_tcp_if_include=$SUBNET"
  return 0
}

stop() {
  if [[ -e "$conf" ]] && alive "$dir/run/slurmctld.pid"; then
    # Jobs first, so that no step outlives its slurmd.
    scancel --full --quiet 2>/dev/null || true
  fi
  stop_pid "$dir/run/slurmctld.pid"
  local pidfile mntns pid
  for pidfile in "$dir"/run/slurmd-*.pid; do
    [[ -e $pidfile ]] || continue
    stop_pid "$pidfile"
    # What the node still runs (slurmstepd, a job's ranks) shares its mount namespace.
    mntns=$(cat "${pidfile%.pid}.mntns" 2>/dev/null || true)
    if [[ -n $mntns ]]; then
      for pid in /proc/[0-9]*; do
        [[ "$(readlink "$pid/ns/mnt" 2>/dev/null)" == "$mntns" ]] && kill -9 "${pid#/proc/}" 2>/dev/null
      done
    fi
    rm -f "${pidfile%.pid}.mntns"
  done
  if [[ -e "$dir/run/namespaces" ]]; then
    remove_namespaces
    rm -f "$dir/run/namespaces"
  fi
  stop_pid "$dir/run/munged.pid"
  echo "slurm_local: stopped ($dir)"
}

status() {
  [[ -e "$conf" ]] || die "no cluster in $dir (scripts/slurm_local.sh start)"
  local name pidfile
  for pidfile in "$dir/run/munged.pid" "$dir/run/slurmctld.pid" "$dir"/run/slurmd-*.pid; do
    [[ -e $pidfile ]] || continue
    name=$(basename "$pidfile" .pid)
    if alive "$pidfile"; then echo "$name: running (pid $(cat "$pidfile"))"; else echo "$name: stopped"; fi
  done
  if alive "$dir/run/slurmctld.pid"; then
    sinfo
    squeue
  fi
}

case "$action" in
  start) start ;;
  env) env_lines ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: slurm_local.sh start|env|status|stop [--nodes 1|2] [--dir DIR] (--help)" >&2; exit 2 ;;
esac
