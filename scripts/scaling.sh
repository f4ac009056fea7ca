#!/usr/bin/env bash
# Scaling sweep: the trainer's training step (build/bench/train_bench) at np = 1, 2, 4, ... up to
# --max-ranks, for each compression and fusion threshold given; then the CSV, the PNG plots and the
# alpha-beta model's prediction against the measurements (build/bench/scaling_model).
#
#   scripts/scaling.sh [--config configs/mnist.json] [--max-ranks 4] [--compression "none fp16"]
#                      [--fusion "0 4"] [--warmup 10] [--steps 30] [--reps 3] [--threads 1]
#                      [--out runs/scaling] [--build build] [--mpirun-args "..."] [--label NAME]
#                      [--link-gbit 25] [--link-latency-us 5] [--set KEY=VALUE ...]
#
#   --config           the config whose training step is timed (per-rank batch: its data.batch_size)
#   --max-ranks        ranks 1, 2, 4, ... up to this
#   --compression      distributed.compression values, each a variant at every np > 1 (none, fp16,
#                      bf16, fp64, powersgd; PowerSGD starts at step 0 here, so that the timed steps
#                      compress)
#   --fusion           distributed.fusion_threshold_mb values (MiB; 0: one bucket per tensor)
#   --warmup, --steps, --reps   untimed steps, then timed steps per repetition, and repetitions
#                      (the median repetition counts)
#   --threads          threads per rank
#   --out              output folder; --build the build folder with bench/ in it
#   --mpirun-args      extra mpirun arguments, e.g. "--mca btl_tcp_if_include eth0"
#   --label            a name for this sweep in the plots' titles and model.txt
#   --link-gbit, --link-latency-us   the network the model extrapolates ResNet-50 to
#   --set KEY=VALUE    a config override for every run (repeatable)
# Relative paths are taken from the current directory.
#
# Writes OUT/scaling.csv, OUT/throughput.png and OUT/efficiency.png (when gnuplot is installed),
# OUT/allreduce.txt (the latency/bandwidth measurement at 2 ranks), OUT/model.txt (the machine, the
# alpha-beta model's fit and its prediction against each run) and OUT/results.jsonl (train_bench's
# RESULT lines). Efficiency at N ranks is (samples/s at N) / (N x samples/s at 1 rank), per-rank batch
# fixed (weak scaling). Beyond this machine's cores the ranks share cores; the sweep says so and the
# CSV marks those rows.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config=configs/mnist.json max_ranks=4 compressions="none fp16" fusions="0 4" warmup=10 steps=30 reps=3
threads=1 out=runs/scaling build=build mpirun_args="" label="" link_gbit=25 link_latency_us=5
# A path given relative, from the directory the script was started in (the defaults are the
# repository's, where the script then works).
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) [ $# -ge 2 ] || { echo "scaling.sh: $1 needs a value (--help lists the options)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --config) config=$(absolute "$2") ;;
    --max-ranks) max_ranks=$2 ;;
    --compression) compressions=$2 ;;
    --fusion) fusions=$2 ;;
    --warmup) warmup=$2 ;;
    --steps) steps=$2 ;;
    --reps) reps=$2 ;;
    --threads) threads=$2 ;;
    --out) out=$(absolute "$2") ;;
    --build) build=$(absolute "$2") ;;
    --mpirun-args) mpirun_args=$2 ;;
    --label) label=$2 ;;
    --link-gbit) link_gbit=$2 ;;
    --link-latency-us) link_latency_us=$2 ;;
    --set) overrides+=(--set "$2") ;;
    *) echo "scaling.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
  shift 2
done
cd "$repo_root"
bench=$build/bench/train_bench
for program in "$bench" "$build/bench/allreduce_bench" "$build/bench/scaling_model"; do
  [ -x "$program" ] || { echo "scaling.sh: $program is not built (scripts/build.sh)" >&2; exit 1; }
done
plots=1
command -v gnuplot >/dev/null || {
  echo "scaling.sh: gnuplot is missing, so no plots (apt-get install gnuplot-nox, or scripts/setup.sh)" >&2; plots=0; }
[ -x "$build/trainer" ] || { echo "scaling.sh: $build/trainer is not built (scripts/build.sh)" >&2; exit 1; }
# Every variant's config checked before the first run, so that a typo does not wait for the sweep.
for c in $compressions; do
  for f in $fusions; do
    check=$("$build/trainer" --config "$config" "${overrides[@]}" --set "distributed.compression=\"$c\"" \
      --set distributed.fusion_threshold_mb="$f" --print-config 2>&1 >/dev/null) ||
      { check=${check#dptrain: error on rank 0: }; echo "scaling.sh: compression $c, fusion $f: ${check#dptrain: error: }" >&2; exit 2; }
  done
done
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
cores=$(nproc)
results=$out/results.jsonl
: >"$results"

# run NP [--set ...]: one train_bench measurement, its RESULT line appended to $results.
run() {
  local np=$1
  shift
  local launcher=()
  if [ "$np" -gt 1 ] || [ -n "$mpirun_args" ]; then
    launcher=(mpirun -np "$np" $mpirun_args)
    [ "$np" -gt "$cores" ] && launcher+=(--oversubscribe)
  fi
  local line
  line=$("${launcher[@]}" "$bench" --config "$config" --threads "$threads" --warmup "$warmup" --steps "$steps" \
         --reps "$reps" "${overrides[@]}" "$@" | sed -n 's/^RESULT //p')
  [ -n "$line" ] || { echo "scaling.sh: train_bench printed no result (np $np $*)" >&2; exit 1; }
  echo "$line" >>"$results"
  printf '  np %-3s %-40s %10.0f samples/s\n' "$np" "$*" "$(echo "$line" | sed 's/.*"samples_per_sec":\([0-9.]*\).*/\1/')"
}

machine="$({ lscpu 2>/dev/null || true; } | sed -n 's/^Model name: *//p' | head -1), $cores core(s)"
echo "scaling sweep of $config: ranks 1..$max_ranks, compression {$compressions}, fusion {$fusions} MiB, $threads thread(s) per rank; $machine"
run 1
np=2
while [ "$np" -le "$max_ranks" ]; do
  [ "$np" -gt "$cores" ] && echo "  (np $np > $cores cores: oversubscribed, ranks share cores; efficiency then includes that)"
  for c in $compressions; do
    for f in $fusions; do
      # PowerSGD otherwise reduces uncompressed until its start_step (100), past a short sweep's steps.
      powersgd=()
      [ "$c" = powersgd ] && powersgd=(--set distributed.powersgd.start_step=0)
      run "$np" --set distributed.compression=$c --set distributed.fusion_threshold_mb=$f "${powersgd[@]}"
    done
  done
  np=$((np * 2))
done

echo "allreduce latency and bandwidth at 2 ranks (bench/allreduce_bench):"
mpirun -np 2 $mpirun_args "$build/bench/allreduce_bench" --max-mib 4 --seconds 0.1 >"$out/allreduce.txt"
sed -n '/^RESULT/!p' "$out/allreduce.txt" | sed 's/^/  /'

{
  echo "machine: $machine"
  "$build/bench/scaling_model" --results "$results" --allreduce "$out/allreduce.txt" --cores "$cores" \
    --csv "$out/scaling.csv" --link-gbit "$link_gbit" --link-latency-us "$link_latency_us" ${label:+--label "$label"}
} | tee "$out/model.txt"
if [ "$plots" = 0 ]; then
  echo "wrote $out/scaling.csv, $out/model.txt (no plots: gnuplot is missing)"
  exit 0
fi

# One line per variant (compression / fusion) against ranks, each starting from the 1-rank run:
# a data file per variant, since gnuplot breaks a line wherever rows of other variants come between.
variants=$(awk -F, 'NR > 1 && $1 > 1 { print $2 "_" $3 }' "$out/scaling.csv" | sort -u)
for v in $variants; do
  awk -F, -v c="${v%_*}" -v f="${v#*_}" 'NR > 1 && ($1 == 1 || ($2 == c && $3 == f))' "$out/scaling.csv" >"$out/.plot_$v.csv"
done
plot() {  # plot COLUMN YLABEL FILE
  local cmd="set terminal pngcairo size 900,560 font ',11'; set output '$out/$3'; set datafile separator ',';"
  cmd+=" set key top right; set grid; set logscale x 2; set xrange [0.9:$((max_ranks * 11 / 10 + 1))];"
  cmd+=" set xlabel 'ranks'; set ylabel '$2'; set title 'dptrain $(basename "$config") ${label:+($label) }on $cores core(s)';"
  [ "$1" = 5 ] && cmd+=" set yrange [0:1.1];"
  cmd+=" plot"
  local sep=""
  for v in $variants; do
    cmd+="$sep '$out/.plot_$v.csv' using 1:$1 with linespoints lw 2 title 'compression ${v%_*}, fusion ${v#*_} MiB'"
    sep=","
  done
  gnuplot -e "$cmd"
}
plot 4 'samples/s (all ranks)' throughput.png
plot 5 'scaling efficiency' efficiency.png
rm -f "$out"/.plot_*.csv
echo "wrote $out/scaling.csv, $out/throughput.png, $out/efficiency.png, $out/model.txt"
