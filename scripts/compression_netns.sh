#!/usr/bin/env bash
# What gradient compression buys on a slow link, as time to accuracy: MNIST training on 2 ranks in
# separate network namespaces (scripts/netns_link.sh: veth, bridge, tbf), for each link rate and
# compression mode. Per run: bytes each rank contributes to the gradient allreduces per step (the
# trainer's gradient_bytes_per_step), samples/s, the test accuracy after each epoch, and the training
# time (evaluations excluded) until the test accuracy first reaches --target. Writes results.tsv,
# table.md and a plot of test accuracy against training time (one panel per rate) to --out.
#
#   scripts/compression_netns.sh [--rates "100mbit 1gbit"]
#       [--modes "none fp16 powersgd:1 powersgd:2 powersgd:4"] [--epochs 5] [--target 0.985]
#       [--config configs/mnist.json] [--out runs/compression] [--build build] [--set KEY=VALUE]...
#
# powersgd:R is distributed.compression "powersgd" at rank R; --set distributed.powersgd.* reaches
# the powersgd runs only (the key is an error without that compression), any other --set every run.
# Needs root (ip netns, tc); exits 77 with the reason when namespaces cannot be made.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rates="100mbit 1gbit" modes="none fp16 powersgd:1 powersgd:2 powersgd:4" epochs=5 target=0.985
config=configs/mnist.json out=runs/compression build=build
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2 ;;
    --modes) modes=$2 ;;
    --epochs) epochs=$2 ;;
    --target) target=$2 ;;
    --config) config=$2 ;;
    --out) out=$2 ;;
    --build) build=$2 ;;
    --set) sets+=(--set "$2") ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "compression_netns.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift 2
done
cd "$repo_root"
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)  # the daemons in the namespaces start from another directory
config=$(realpath "$config")
[ -x "$build/trainer" ] || { echo "compression_netns.sh: $build/trainer is not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$repo_root/scripts/netns_link.sh"

# field FILE KEY: KEY's value on each line of a metrics.jsonl (numbers only).
field() { sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" "$1"; }

printf 'rate\tmode\tbytes_per_step\tsamples_per_sec\tfinal_accuracy\tseconds_to_target\tepoch_to_target\ttotal_seconds\n' \
  >"$out/results.tsv"
for rate in $rates; do
  throttle "$rate"
  echo "== $rate (tbf burst $burst bytes)"
  for mode in $modes; do
    run=$out/$rate/${mode/:/_rank}
    rm -rf "$run"
    mkdir -p "$run"
    args=(--set "distributed.compression=\"${mode%%:*}\"")
    for ((i = 1; i < ${#sets[@]}; i += 2)); do
      [[ $mode != powersgd:* && ${sets[i]} == distributed.powersgd.* ]] || args+=(--set "${sets[i]}")
    done
    [[ $mode == powersgd:* ]] && args+=(--set "distributed.powersgd.rank=${mode#*:}")
    mpi "$run/train.log" "$build/trainer" --config "$config" --set "output_dir=\"$run\"" --set threads=1 \
      --set "data.dir=\"$repo_root/data/mnist\"" --set "training.epochs=$epochs" --set training.progress=lines \
      --set checkpoint.every_epochs=0 "${args[@]}"
    metrics=$run/metrics.jsonl
    paste <(field "$metrics" test_accuracy) <(field "$metrics" epoch_seconds) \
      <(field "$metrics" gradient_bytes_per_step) <(field "$metrics" samples_per_sec) |
      awk -v rate="$rate" -v mode="$mode" -v target="$target" -v OFS='\t' '
        { t += $2; acc = $1; bytes += $3; speed += $4; n++
          if (!reached && $1 >= target) { reached = 1; to = t; epoch = n } }
        END { if (n == 0) { print "no epochs in metrics.jsonl" > "/dev/stderr"; exit 1 }
              printf "%s\t%s\t%.0f\t%.0f\t%.4f\t%s\t%s\t%.1f\n", rate, mode, bytes / n, speed / n, acc,
                     reached ? sprintf("%.1f", to) : "not reached", reached ? epoch : "-", t }' |
      tee -a "$out/results.tsv" | awk -F'\t' '{ printf "  %-11s %8.0f B/step  %6.0f samples/s  final %.2f%%  to target: %s s (epoch %s)\n",
                                             $2, $3, $4, 100 * $5, $6, $7 }'
    # Accuracy against cumulative training time, for the plot.
    paste <(field "$metrics" epoch_seconds) <(field "$metrics" test_accuracy) |
      awk '{ t += $1; print t, 100 * $2 }' >"$run/curve.dat"
  done
done

{
  echo "| link | compression | bytes per step per rank | samples/s | final test accuracy | time to $(awk -v t="$target" 'BEGIN { printf "%.1f%%", 100 * t }') |"
  echo "|---|---|---|---|---|---|"
  tail -n +2 "$out/results.tsv" | awk -F'\t' '{
    bytes = $3 >= 1e6 ? sprintf("%.2f MB", $3 / 1e6) : sprintf("%.1f kB", $3 / 1e3)
    to = $6 == "not reached" ? $6 : sprintf("%s s (epoch %s)", $6, $7)
    printf "| %s | %s | %s | %s | %.2f%% | %s |\n", $1, $2, bytes, $4, 100 * $5, to }'
} >"$out/table.md"
cat "$out/table.md"

if command -v gnuplot >/dev/null; then
  plot=""
  panels=0
  for rate in $rates; do panels=$((panels + 1)); done
  {
    echo "set terminal pngcairo size $((560 * panels)),420 font ',10'"
    echo "set output '$out/time_to_accuracy.png'"
    echo "set multiplot layout 1,$panels title 'MNIST CNN, 2 ranks across network namespaces: test accuracy against training time'"
    echo "set xlabel 'training time (s, evaluations excluded)'; set ylabel 'test accuracy (%)'; set grid; set key bottom right"
    echo "set arrow from graph 0, first $(awk -v t="$target" 'BEGIN { print 100 * t }') to graph 1, first $(awk -v t="$target" 'BEGIN { print 100 * t }') nohead dt 2"
    for rate in $rates; do
      plot=""
      for mode in $modes; do
        plot+="${plot:+, }'$out/$rate/${mode/:/_rank}/curve.dat' using 1:2 with linespoints title '$mode'"
      done
      echo "set title 'link $rate'"
      echo "plot $plot"
    done
    echo "unset multiplot"
  } | gnuplot
  echo "plot: $out/time_to_accuracy.png"
fi
