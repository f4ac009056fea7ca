#!/usr/bin/env bash
# What gradient compression buys on a slow link, as time to accuracy: MNIST training on 2 ranks in
# separate network namespaces (scripts/netns_link.sh: veth, bridge, tbf), for each link rate and
# compression mode. Per run: bytes each rank contributes to the gradient allreduces per step (the
# trainer's gradient_bytes_per_step), samples/s, compute and communication not overlapped per step,
# the test accuracy after each epoch, and the training time (evaluations excluded) until the test
# accuracy first reaches --target. Writes results.tsv (one
# row per run), table.md (per rate and mode the median over --repeats, with the range of the time to
# target) and a plot of test accuracy against training time (one panel per rate, the median run's
# curve) to --out. Repeats are interleaved (round 1 of every rate and mode, then round 2, ...) so
# that a slow spell of a shared machine does not land on one mode only.
#
#   scripts/compression_netns.sh [--rates "100mbit 1gbit"]
#       [--modes "none fp16 powersgd:1 powersgd:2 powersgd:4"] [--epochs 5] [--target 0.985]
#       [--repeats 1] [--config configs/mnist.json] [--out runs/compression] [--build build]
#       [--set KEY=VALUE]... [--summarize-only]
#
# powersgd:R is distributed.compression "powersgd" at rank R; --set distributed.powersgd.* reaches
# the powersgd runs only (the key is an error without that compression), any other --set every run.
# --summarize-only rebuilds results.tsv, table.md and the plot from the runs already in --out.
# Needs root (ip netns, tc), except with --summarize-only; exits 77 with the reason when namespaces
# cannot be made. Relative paths are taken from the current directory; the config's data.dir
# from there where it exists, else from the repository (MNIST: where scripts/setup.sh put it).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rates="100mbit 1gbit" modes="none fp16 powersgd:1 powersgd:2 powersgd:4" epochs=5 target=0.985 repeats=1
config=configs/mnist.json out=runs/compression build=build summarize_only=0
# A path given relative, from the directory the script was started in (the defaults are the
# repository's, where the script then works).
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help | --summarize-only) ;;
    -*) [ $# -ge 2 ] || { echo "compression_netns.sh: $1 needs a value (--help lists the options)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --rates) rates=$2 ;;
    --modes) modes=$2 ;;
    --epochs) epochs=$2 ;;
    --target) target=$2 ;;
    --repeats) repeats=$2 ;;
    --config) config=$(absolute "$2") ;;
    --out) out=$(absolute "$2") ;;
    --build) build=$(absolute "$2") ;;
    --set) sets+=(--set "$2") ;;
    --summarize-only) summarize_only=1; shift; continue ;;
    -h | --help) sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compression_netns.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift 2
done
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "compression_netns.sh: --repeats must be a positive integer, got '$repeats'" >&2; exit 2; }
start_dir=$PWD
cd "$repo_root"
mkdir -p "$out"
out=$(cd "$out" && pwd)

# field FILE KEY: KEY's value on each line of a metrics.jsonl (numbers only).
field() { sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" "$1"; }

# run_dir RATE MODE REPEAT
run_dir() { local dir=$out/$1/${2/:/_rank}; [ "$repeats" -eq 1 ] && echo "$dir" || echo "$dir/repeat$3"; }

# summarize RATE MODE REPEAT: the run's row of results.tsv on stdout, its curve.dat (test accuracy
# against cumulative training time, for the plot) in its directory.
summarize() {
  local run metrics
  run=$(run_dir "$1" "$2" "$3")
  metrics=$run/metrics.jsonl
  [ -s "$metrics" ] || { echo "compression_netns.sh: no $metrics" >&2; return 1; }
  paste <(field "$metrics" test_accuracy) <(field "$metrics" epoch_seconds) \
    <(field "$metrics" gradient_bytes_per_step) <(field "$metrics" samples_per_sec) \
    <(field "$metrics" compute) <(field "$metrics" communication) |
    awk -v rate="$1" -v mode="$2" -v repeat="$3" -v target="$target" -v OFS='\t' '
      { t += $2; acc = $1; bytes += $3; speed += $4; compute += $5; communication += $6; n++
        if (!reached && $1 >= target) { reached = 1; to = t; epoch = n } }
      END { if (n == 0) { print "no epochs in metrics.jsonl" > "/dev/stderr"; exit 1 }
            printf "%s\t%s\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t%.4f\t%s\t%s\t%.1f\n", rate, mode, repeat, bytes / n,
                   speed / n, compute / n, communication / n, acc,
                   reached ? sprintf("%.1f", to) : "not reached", reached ? epoch : "-", t }'
  paste <(field "$metrics" epoch_seconds) <(field "$metrics" test_accuracy) |
    awk '{ t += $1; print t, 100 * $2 }' >"$run/curve.dat"
}

header='rate\tmode\trepeat\tbytes_per_step\tsamples_per_sec\tcompute_ms\tcommunication_ms\tfinal_accuracy\tseconds_to_target\tepoch_to_target\ttotal_seconds\n'
if [ "$summarize_only" = 1 ]; then
  # Into a new file first: a --rates or --modes that names a run not in --out stops here (set -e)
  # and leaves the results.tsv that was there.
  trap 'rm -f "$out/results.tsv.new"' EXIT
  {
    printf "$header"
    for ((repeat = 1; repeat <= repeats; repeat++)); do
      for rate in $rates; do
        for mode in $modes; do summarize "$rate" "$mode" "$repeat"; done
      done
    done
  } >"$out/results.tsv.new"
  mv "$out/results.tsv.new" "$out/results.tsv"
  trap - EXIT
else
 build=$(cd "$build" && pwd)  # the daemons in the namespaces start from another directory
 config=$(realpath "$config")
 [ -x "$build/trainer" ] || { echo "compression_netns.sh: $build/trainer is not built" >&2; exit 1; }
 # The config's data.dir made absolute (the daemons start elsewhere): from the directory the script
 # was started in, else from the repository's; MNIST's default where scripts/setup.sh put it. A
 # --set data.dir=... comes later and wins.
 data_dir=$("$build/trainer" --config "$config" --print-config |
   awk '/^  "data": \{/ { d = 1; next } d && /^  \}/ { d = 0 } d && /^    "dir": / { print; exit }' |
   sed 's/^    "dir": "\(.*\)",\{0,1\}$/\1/')
 [[ $data_dir == data/mnist && -n ${DPTRAIN_DATA_DIR:-} ]] && data_dir=$DPTRAIN_DATA_DIR
 # mode_args MODE: the trainer's --set arguments for a mode, with the --set's that reach it.
 mode_args() {
   local mode=$1 i
   args=(--set "distributed.compression=\"${mode%%:*}\"")
   for ((i = 1; i < ${#sets[@]}; i += 2)); do
     [[ $mode != powersgd:* && ${sets[i]} == distributed.powersgd.* ]] || args+=(--set "${sets[i]}")
   done
   [[ $mode == powersgd:* ]] && args+=(--set "distributed.powersgd.rank=${mode#*:}")
   return 0
 }
 # Every mode's config checked before the first run, so that a typo does not wait for the others.
 for mode in $modes; do
   mode_args "$mode"
   check=$("$build/trainer" --config "$config" "${args[@]}" --print-config 2>&1 >/dev/null) ||
     { check=${check#dptrain: error on rank 0: }; echo "compression_netns.sh: mode $mode: ${check#dptrain: error: }" >&2; exit 2; }
 done
 if [[ $data_dir != /* ]]; then
   if [[ -e $start_dir/$data_dir ]]; then data_dir=$start_dir/$data_dir; else data_dir=$repo_root/$data_dir; fi
 fi
 export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
 source "$repo_root/scripts/netns_link.sh"
 for rate in $rates; do check_rate "$rate"; done
 printf "$header" >"$out/results.tsv"
 for ((repeat = 1; repeat <= repeats; repeat++)); do
 for rate in $rates; do
  throttle "$rate"
  echo "== $rate (tbf burst $burst bytes)$([ "$repeats" -gt 1 ] && echo ", repeat $repeat of $repeats")"
  for mode in $modes; do
    run=$(run_dir "$rate" "$mode" "$repeat")
    rm -rf "$run"
    mkdir -p "$run"
    mode_args "$mode"
    mpi "$run/train.log" "$build/trainer" --config "$config" --set "output_dir=\"$run\"" --set threads=1 \
      --set "data.dir=\"$data_dir\"" --set "training.epochs=$epochs" --set training.progress=lines \
      --set checkpoint.every_epochs=0 "${args[@]}"
    summarize "$rate" "$mode" "$repeat" | tee -a "$out/results.tsv" | awk -F'\t' '{
      printf "  %-11s %8.0f B/step  %6.0f samples/s  step %.1f ms compute + %.1f ms communication  final %.2f%%  to target: %s\n",
        $2, $4, $5, $6, $7, 100 * $8, $9 == "not reached" ? $9 : sprintf("%s s (epoch %s)", $9, $10) }'
  done
 done
 done
fi

# Per rate and mode, the median of each column over the repeats; "not reached" sorts last.
target_percent=$(awk -v t="$target" 'BEGIN { printf "%.1f%%", 100 * t }')
{
  [ "$repeats" -gt 1 ] && echo "Medians of $repeats interleaved runs; the time to $target_percent with its range."
  echo "| link | compression | bytes per step per rank | samples/s | step: compute + communication not overlapped | final test accuracy | time to $target_percent |"
  echo "|---|---|---|---|---|---|---|"
  awk -F'\t' -v never=1e99 '
    function median(column, key, count,   i, j, v, tmp) {
      for (i = 1; i <= count; i++) v[i] = value[column, key, i]
      for (i = 2; i <= count; i++)
        for (j = i; j > 1 && v[j - 1] > v[j]; j--) { tmp = v[j]; v[j] = v[j - 1]; v[j - 1] = tmp }
      low = v[1]; high = v[count]
      return count % 2 ? v[(count + 1) / 2] : (v[count / 2] + v[count / 2 + 1]) / 2
    }
    NR > 1 {
      key = $1 SUBSEP $2
      if (!(key in runs)) order[++groups] = key
      n = ++runs[key]
      for (c = 4; c <= 10; c++) value[c, key, n] = ($c == "not reached" || $c == "-") ? never : $c + 0
    }
    END {
      for (g = 1; g <= groups; g++) {
        key = order[g]; n = runs[key]; split(key, name, SUBSEP)
        bytes = median(4, key, n)
        bytes = bytes >= 1e6 ? sprintf("%.2f MB", bytes / 1e6) : sprintf("%.1f kB", bytes / 1e3)
        step = sprintf("%.1f + %.1f ms", median(6, key, n), median(7, key, n))
        epoch = median(10, key, n)
        seconds = median(9, key, n)
        if (seconds >= never) to = "not reached"
        else if (n == 1) to = sprintf("%.1f s (epoch %d)", seconds, epoch)
        else to = sprintf("%.1f s (%.1f-%s, epoch %d)", seconds, low, high >= never ? "not reached" : sprintf("%.1f", high), epoch)
        printf "| %s | %s | %s | %.0f | %s | %.2f%% | %s |\n", name[1], name[2], bytes, median(5, key, n), step,
               100 * median(8, key, n), to
      }
    }' "$out/results.tsv"
} >"$out/table.md"
cat "$out/table.md"

if command -v gnuplot >/dev/null; then
  plot=""
  panels=0
  for rate in $rates; do panels=$((panels + 1)); done
  {
    echo "set terminal pngcairo size $((560 * panels)),420 font ',10'"
    echo "set output '$out/time_to_accuracy.png'"
    echo "set multiplot layout 1,$panels title '$(basename "$config" .json), 2 ranks across network namespaces: test accuracy against training time'"
    echo "set xlabel 'training time (s, evaluations excluded)'; set ylabel 'test accuracy (%)'; set grid; set key bottom right"
    echo "set arrow from graph 0, first $(awk -v t="$target" 'BEGIN { print 100 * t }') to graph 1, first $(awk -v t="$target" 'BEGIN { print 100 * t }') nohead dt 2"
    for rate in $rates; do
      plot=""
      for mode in $modes; do
        # The run whose time to target is the median (the lower one of the middle two).
        median_repeat=$(awk -F'\t' -v rate="$rate" -v mode="$mode" '$1 == rate && $2 == mode {
            print ($9 == "not reached" ? 1e99 : $9), $3 }' "$out/results.tsv" |
          sort -g | awk '{ r[NR] = $2 } END { print r[int((NR + 1) / 2)] }')
        plot+="${plot:+, }'$(run_dir "$rate" "$mode" "$median_repeat")/curve.dat' using 1:2 with linespoints title '$mode'"
      done
      echo "set title 'link $rate'"
      echo "plot $plot"
    done
    echo "unset multiplot"
  } | gnuplot
  echo "plot: $out/time_to_accuracy.png"
else
  echo "no plot: gnuplot is missing (apt-get install gnuplot-nox, or scripts/setup.sh)"
fi
