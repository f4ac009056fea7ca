#!/usr/bin/env bash
# Memory of a data set larger than the ranks' budget: trains one epoch at np 2 on a generated .npy
# set (default 700000 colour images of 3x64x64, 8.6 GB) with a linear model, sampling every rank's
# anonymous and file-backed resident memory (/proc/PID/status RssAnon, RssFile) each second, and
# prints each rank's peaks. The mapped file's pages are file-backed: they come and go with the page
# cache and are shared by the ranks; what the loader itself holds is anonymous.
#
#   bench/data_memory.sh [--samples 700000] [--dir /tmp/dptrain_big_npy] [--build build]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
samples=700000 dir=/tmp/dptrain_big_npy build=$root/build
while (($#)); do
  case $1 in
    --samples) samples=$2; shift ;;
    --dir) dir=$2; shift ;;
    --build) build=$2; shift ;;
    *) echo "data_memory.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [[ ! -s $dir/train_x.npy ]]; then
  "$build/export_dataset" --from synthetic_color --shape 3 64 64 --train-samples "$samples" \
    --test-samples 2000 --to "$dir" --format npy
fi
echo "data set: $(du -sh "$dir" | cut -f1) in $dir; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
out=$(mktemp -d)
mpirun -np 2 "$build/trainer" --config "$root/configs/mnist_mlp.json" --set 'data.dataset="npy"' \
  --set "data.dir=\"$dir\"" --set 'model.input_shape=[3,64,64]' \
  --set 'model.layers=[{"type":"flatten"},{"type":"dense","out_features":10}]' \
  --set data.batch_size=256 --set training.epochs=1 --set 'data.mean=[0.5,0.5,0.5]' \
  --set 'data.std=[0.25,0.25,0.25]' --set training.progress=lines --set "output_dir=\"$out\"" >"$out/train.log" 2>&1 &
launcher=$!
declare -A anon file
while kill -0 "$launcher" 2>/dev/null; do
  for status in /proc/[0-9]*/status; do
    grep -q '^Name:.*trainer' "$status" 2>/dev/null || continue
    pid=$(basename "$(dirname "$status")")
    a=$(awk '/^RssAnon/ { print $2 }' "$status" 2>/dev/null || echo 0)
    f=$(awk '/^RssFile/ { print $2 }' "$status" 2>/dev/null || echo 0)
    ((${a:-0} > ${anon[$pid]:-0})) && anon[$pid]=$a
    ((${f:-0} > ${file[$pid]:-0})) && file[$pid]=$f
  done
  sleep 1
done
wait "$launcher" || { tail -5 "$out/train.log"; exit 1; }
grep -E '^(data|loader):|^epoch 1:' "$out/train.log"
for pid in "${!anon[@]}"; do
  printf 'rank process %s: peak anonymous %d MB, peak file-backed %d MB\n' "$pid" $((anon[$pid] / 1024)) $((file[$pid] / 1024))
done
rm -rf "$out"
