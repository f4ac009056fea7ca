#!/usr/bin/env bash
# Training curves: loss and accuracy per epoch (train dashed, test solid), one colour per run, from
# each run's metrics.jsonl, drawn with gnuplot into one PNG so runs with different settings compare
# at a glance.
#
#   scripts/plot_metrics.sh [-o OUT.png] [--title TEXT] RUN_DIR[=LABEL] [RUN_DIR[=LABEL] ...]
#
# RUN_DIR is a trainer output_dir (it holds metrics.jsonl); LABEL names it in the key (default: the
# directory's name). OUT.png defaults to training_curves.png. Regression runs (no accuracy) get the
# loss panel only. An epoch written twice (a run stopped by training.max_steps, then resumed) is
# plotted once, with its last line.
set -euo pipefail

out=training_curves.png
title="dptrain training curves"
runs=()
while (($#)); do
  case "$1" in
    -o | --title) [ $# -ge 2 ] || { echo "plot_metrics.sh: $1 needs a value (try --help)" >&2; exit 2; } ;;&
    -o) out="$2"; shift 2 ;;
    --title) title="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "plot_metrics.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    *) runs+=("$1"); shift ;;
  esac
done
((${#runs[@]})) || { echo "plot_metrics.sh: give at least one run directory (try --help)" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "plot_metrics.sh: gnuplot not found (scripts/setup.sh installs gnuplot-nox)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# metrics.jsonl -> "epoch train_loss test_loss train_accuracy test_accuracy" rows, one per epoch.
to_table() {
  awk '
    function field(key,   at) {
      if (!match($0, "\"" key "\":[-0-9.eE+]+")) return "nan"
      at = substr($0, RSTART, RLENGTH)
      return substr(at, index(at, ":") + 1)
    }
    { epoch = field("epoch") + 0; if (epoch > last) last = epoch
      row[epoch] = epoch " " field("train_loss") " " field("test_loss") " " field("train_accuracy") " " field("test_accuracy") }
    END { for (e = 1; e <= last; ++e) if (e in row) print row[e] }' "$1"
}

has_accuracy=0
loss_plot="" accuracy_plot="" sep=""
for i in "${!runs[@]}"; do
  spec="${runs[$i]}"
  dir="${spec%%=*}"
  label="$(basename "$dir")"
  [[ "$spec" == *=* ]] && label="${spec#*=}"
  [[ -s "$dir/metrics.jsonl" ]] || { echo "plot_metrics.sh: $dir/metrics.jsonl is missing or empty" >&2; exit 1; }
  to_table "$dir/metrics.jsonl" >"$tmp/$i.dat"
  awk '$4 > 0 || $5 > 0 { found = 1 } END { exit !found }' "$tmp/$i.dat" && has_accuracy=1
  label="${label//\'/}"
  colour=$((i + 1))
  loss_plot+="$sep'$tmp/$i.dat' using 1:2 with linespoints lt $colour dt 2 title '$label train',"
  loss_plot+=" '$tmp/$i.dat' using 1:3 with linespoints lt $colour dt 1 title '$label test'"
  accuracy_plot+="$sep'$tmp/$i.dat' using 1:(100*\$4) with linespoints lt $colour dt 2 title '$label train',"
  accuracy_plot+=" '$tmp/$i.dat' using 1:(100*\$5) with linespoints lt $colour dt 1 title '$label test'"
  sep=", "
done

width=$((has_accuracy ? 1200 : 650))
{
  echo "set terminal pngcairo size $width,480 font ',10'"
  echo "set output '$out'"
  echo "set grid; set key top right; set xlabel 'epoch'; set xtics 1; set pointsize 0.8"
  ((has_accuracy)) && echo "set multiplot layout 1,2 title '${title//\'/}'" || echo "set title '${title//\'/}'"
  echo "set ylabel 'loss'; set logscale y"
  echo "plot $loss_plot"
  if ((has_accuracy)); then
    echo "unset logscale y; set ylabel 'accuracy (%)'; set key bottom right"
    echo "plot $accuracy_plot"
    echo "unset multiplot"
  fi
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
echo "wrote $out (${#runs[@]} run(s))"
