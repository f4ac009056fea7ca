#!/usr/bin/env bash
# Horovod's synthetic benchmark at np 2 against its ceiling: two independent 1-rank runs at the same
# time, one per core, summed (what two ranks could reach with communication for free; memory
# bandwidth and caches are shared). Measured in interleaved pairs (np 2, then its ceiling) so that a
# slow spell of the VM lands on both sides of a ratio; the median ratio is the figure.
# Synchronous training runs at its slower rank's pace, so where the VM gives one core less time than
# the other the ratio cannot pass 2 min(core 0, core 1) / (core 0 + core 1): printed as "bound", from
# the same pair's independent runs, so that a slow core is not mistaken for communication.
# "work" is the same pair's CPU time per step (every thread of the process), the independent runs'
# mean over np 2's: below 1 by the CPU time np 2 adds (the reduction's, and kernels slowed by the
# ranks streaming memory at once). The rest of what the ratio lacks is
# time a rank waited for its peer (the faster rank of each step idles; independent runs never wait):
# "waited", np 2's share of a step without CPU time, 1 - CPU time / wall time per step.
# A core that the VM slows also takes more CPU time per step, so "work" moves with the VM too, less.
# --versus KEY=VALUE adds a second np 2 run to each pair with that config override (an A/B of a
# setting, e.g. distributed.shared_memory=false), its ratio to the same ceiling, and the median of
# the pairs' np 2 / np 2 (KEY=VALUE).
#
#   bench/synthetic_scaling.sh [--build build] [--model resnet18] [--input-shape 3,64,64]
#                              [--batch-size 32] [--pairs 5] [--versus KEY=VALUE]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo_root/build" model=resnet18 shape=3,64,64 batch=32 pairs=5 versus=
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) ;;
    -*) [ $# -ge 2 ] || { echo "synthetic_scaling: $1 needs a value (--help lists the options)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --build) build=$2 ;;
    --model) model=$2 ;;
    --input-shape) shape=$2 ;;
    --batch-size) batch=$2 ;;
    --pairs) pairs=$2 ;;
    --versus) versus=$2 ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "synthetic_scaling: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
  shift 2
done
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "synthetic_scaling: --pairs must be a positive integer, got '$pairs'" >&2; exit 2; }
bench="$build/bench/synthetic_benchmark"
[[ -x "$bench" ]] || { echo "synthetic_scaling: $bench not built (cmake --build $build --target synthetic_benchmark)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--model "$model" --input-shape "$shape" --batch-size "$batch" --threads 1 --num-warmup-batches 2
      --num-batches-per-iter 5 --num-iters 3)
# result FILE EXPR: EXPR over the RESULT line's json `r`.
result() { sed -n 's/^RESULT //p' "$1" | /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin); print($2)"; }
total() { result "$1" 'r["img_per_sec_median"] * r["ranks"]'; }
cpu_ms() { result "$1" 'r["cpu_ms_per_step"]'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ratios=() bounds=() works=() waits=() versus_ratios=() gains=()
[[ -z $versus ]] || echo "versus: np 2 with --set $versus, in the same pairs"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPU(s) for this process"
printf '%-5s %12s %12s %7s %9s %9s %7s %6s %7s' pair "np 2 img/s" ceiling ratio "core 0" "core 1" bound work waited
[[ -z $versus ]] || printf ' %13s %7s' "versus img/s" ratio
printf '\n'
python() { /usr/bin/python3 -c "$1"; }
for ((pair = 1; pair <= pairs; ++pair)); do
  mpirun -np 2 --bind-to core "$bench" "${args[@]}" >"$tmp/np2"
  np2=$(total "$tmp/np2")
  if [[ -n $versus ]]; then
    mpirun -np 2 --bind-to core "$bench" "${args[@]}" --set "$versus" >"$tmp/versus"
    other=$(total "$tmp/versus")
  fi
  taskset -c 0 "$bench" "${args[@]}" >"$tmp/core0" &
  first=$!
  taskset -c 1 "$bench" "${args[@]}" >"$tmp/core1"
  wait "$first"
  core0=$(total "$tmp/core0") core1=$(total "$tmp/core1")
  ceiling=$(python "print($core0 + $core1)")
  ratio=$(python "print(f'{$np2 / $ceiling:.3f}')")
  bound=$(python "print(f'{2 * min($core0, $core1) / $ceiling:.3f}')")
  work=$(python "print(f'{($(cpu_ms "$tmp/core0") + $(cpu_ms "$tmp/core1")) / 2 / $(cpu_ms "$tmp/np2"):.3f}')")
  waited=$(result "$tmp/np2" '"%.3f" % (1 - r["cpu_ms_per_step"] / r["step_ms"]["total"])')
  ratios+=("$ratio") bounds+=("$bound") works+=("$work") waits+=("$waited")
  printf '%-5s %12.1f %12.1f %7s %9.1f %9.1f %7s %6s %7s' "$pair" "$np2" "$ceiling" "$ratio" "$core0" "$core1" "$bound" \
    "$work" "$waited"
  if [[ -n $versus ]]; then
    versus_ratios+=("$(python "print(f'{$other / $ceiling:.3f}')")") gains+=("$(python "print($np2 / $other)")")
    printf ' %13.1f %7s' "$other" "${versus_ratios[-1]}"
  fi
  printf '\n'
done
median_of() { /usr/bin/python3 -c 'import statistics,sys; print(f"{statistics.median(float(v) for v in sys.argv[1:]):.3f}")' "$@"; }
echo "$model $shape batch $batch per rank: np 2 / two independent runs, median of $pairs pairs: $(median_of "${ratios[@]}")" \
  "(the cores' bound: median $(median_of "${bounds[@]}"); work: median $(median_of "${works[@]}");" \
  "waited: median $(median_of "${waits[@]}"))"
[[ -z $versus ]] || echo "with $versus: median $(median_of "${versus_ratios[@]}"); np 2 / np 2 with $versus," \
  "median of the pairs: $(median_of "${gains[@]}")"
