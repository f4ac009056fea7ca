#!/usr/bin/env bash
# End-to-end checks of the data formats, the loader and augmentation, on MNIST exported by
# build/export_dataset into every format (ctest: e2e_<case>).
#
#   formats_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (exit 77 = skipped when data/mnist is absent):
#   npy_matches_idx     MNIST exported as .npy trains to the same bytes as from its IDX files (np 2);
#                       exported again into its own folder, cut to 100 samples, it keeps them whole
#   png_matches_idx     the IDX-trained weights evaluated on the PNG folder export and on IDX: the same
#                       correct count and loss (PNG is lossless; the folder's order differs, the exact
#                       sums do not); a JPEG (quality 90) folder trains, its accuracy printed
#   augment_bitwise     random crop + flip with 2 workers: killed mid-epoch and resumed equals a
#                       straight run byte for byte; deterministic mode np 1 and np 2 byte-identical
#   bad_data            a truncated PNG, a garbage file, an empty class, a class list changed under a
#                       resume, a .npy with a bad header and labels out of range (generated images, cut
#                       by --max-samples): one line each naming the file; on_bad_sample "skip" trains
#                       on, warning with a count
source "$(dirname "$0")/../e2e_common.sh"
EXPORT=$(dirname "$TRAINER")/export_dataset

# A small epoch: 4096 / (2 ranks x 32) = 64 steps, 1000 test samples.
SAMPLES=$(pick 4096 1024)
DATA=(--set data.max_train_samples="$SAMPLES" --set data.max_test_samples=1000 --set data.batch_size=32
      --set training.epochs=1)

# export NAME FORMAT [options]: MNIST's first $SAMPLES of each split into $SCRATCH/NAME.
export_mnist() {
  local name=$1 format=$2
  shift 2
  "$EXPORT" --from mnist --dir "$MNIST_DIR" --to "$SCRATCH/$name" --format "$format" \
    --max-samples "$SAMPLES" "$@" >"export_$name.out" 2>&1 || { cat "export_$name.out"; fail "export to $format failed"; }
}

# The one line the trainer printed on stderr when it stopped, which must name every later argument.
expect_error() {
  local name=$1
  shift
  [ "$RC" -ne 0 ] || fail "$name exited 0"
  local line
  line=$(grep -m1 '^dptrain: error' "$name.err")
  echo "  $name: $line"
  for part in "$@"; do
    [[ $line == *"$part"* ]] || fail "$name's error does not name '$part'"
  done
}

# evaluation NAME: "loss accuracy correct" of a --evaluate run's line.
evaluation() { sed -n 's/.*test loss \([0-9.]*\), accuracy [0-9.]*% (\([0-9]*\) of.*/\1 \2/p' "$1.out"; }

need_mnist
case "$CASE" in
  npy_matches_idx)
    export_mnist npy npy
    train 2 idx mnist_mlp.json "${DATA[@]}"
    train 2 npy mnist_mlp.json "${DATA[@]}" --set 'data.dataset="npy"' --set "data.dir=\"$SCRATCH/npy\""
    cmp idx/model.safetensors npy/model.safetensors || fail "npy weights differ from IDX's"
    echo "  npy and IDX weights byte-identical: $(sha256sum <npy/model.safetensors | cut -c1-16)"
    # Exported into its own folder, cut to 100 samples: the export reads the arrays it replaces, which
    # stay whole until the rename (a rewrite in place read what it was writing).
    cp npy/train_x.npy before_x.npy
    "$EXPORT" --from npy --dir "$SCRATCH/npy" --to "$SCRATCH/npy" --format npy --max-samples 100 \
      >export_self.out 2>&1 || { cat export_self.out; fail "the export into its own folder failed"; }
    header() { echo $((10 + $(od -An -tu2 -j8 -N2 "$1"))); }  # npy 1.0: 10 bytes, then the header's length
    cmp <(tail -c +$(($(header before_x.npy) + 1)) before_x.npy | head -c 78400) \
      <(tail -c +$(($(header npy/train_x.npy) + 1)) npy/train_x.npy) ||
      fail "the arrays exported into their own folder are not the first 100 samples"
    ls npy | grep -q tmp && fail "a temp file was left: $(ls npy)"
    echo "  exported into its own folder: the first 100 samples, byte for byte"
    ;;

  png_matches_idx)
    export_mnist png png
    export_mnist jpeg jpeg --quality 90
    train 2 idx mnist_mlp.json "${DATA[@]}"
    ckpt=$(ls idx/checkpoints/ckpt-*.safetensors | tail -1)
    train_args=(mnist_mlp.json "${DATA[@]}" --set 'data.dataset="image_folder"')
    # All the exported test samples: a cap of 1000 would take other ones (each class's first files).
    train_args+=(--set data.max_test_samples="$SAMPLES")
    RUN_DIR=eval launch 2 eval_idx mnist_mlp.json "${DATA[@]}" --set data.max_test_samples="$SAMPLES" --evaluate "$ckpt"
    [ "$RC" -eq 0 ] || fail "evaluation on IDX failed"
    RUN_DIR=eval launch 2 eval_png "${train_args[@]}" --set "data.dir=\"$SCRATCH/png\"" --evaluate "$ckpt"
    [ "$RC" -eq 0 ] || { cat eval_png.err; fail "evaluation on the PNG folder failed"; }
    echo "  IDX: $(evaluation eval_idx); PNG folder: $(evaluation eval_png) (loss, correct of $SAMPLES)"
    [ -n "$(evaluation eval_idx)" ] && [ "$(evaluation eval_idx)" = "$(evaluation eval_png)" ] ||
      fail "the PNG folder evaluates differently from IDX"
    train 2 jpeg "${train_args[@]}" --set "data.dir=\"$SCRATCH/jpeg\""
    grep -m1 '^loader:' jpeg.out
    accuracy=$(sed -n 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/p' jpeg/metrics.jsonl | tail -1)
    echo "  JPEG (quality 90) folder, 1 epoch: test accuracy $accuracy"
    small || awk -v a="$accuracy" 'BEGIN { exit !(a > 0.75) }' || fail "JPEG folder accuracy $accuracy <= 0.75"
    ;;

  augment_bitwise)
    AUG=(mnist_mlp.json "${DATA[@]}" --set training.epochs=2 --set data.workers=2
         --set data.augment.random_crop_padding=2 --set data.augment.horizontal_flip=true
         --set checkpoint.every_steps=20 --set checkpoint.every_epochs=0)
    train 2 straight "${AUG[@]}"
    grep -m1 '^loader:' straight.out
    # 64 steps per epoch (16 in the sanitizer build): killed in epoch 2, resumed from step 80 (20).
    DPTRAIN_INJECT_FAULT=1:$(pick 90 25):kill RUN_DIR=resumed launch 2 killed "${AUG[@]}"
    [ "$RC" -ne 0 ] || fail "the run meant to be killed exited 0"
    RUN_DIR=resumed train 2 resumed "${AUG[@]}" --resume auto
    grep -m1 '^dptrain: resuming' resumed.out
    cmp straight/model.safetensors resumed/model.safetensors || fail "resumed weights differ from the straight run's"
    echo "  killed mid-epoch and resumed: weights byte-identical to the straight run's"
    DET=(mnist_mlp.json "${DATA[@]}" --set data.workers=2 --set data.augment.random_crop_padding=2
         --set data.augment.horizontal_flip=true --set distributed.deterministic=true
         --set distributed.deterministic_micro_batch=16 --set 'optimizer.lr_scaling="none"')
    train 1 det1 "${DET[@]}" --set data.batch_size=64
    train 2 det2 "${DET[@]}"
    cmp det1/model.safetensors det2/model.safetensors || fail "deterministic np 1 and np 2 differ with augmentation"
    echo "  deterministic mode with augmentation: np 1 and np 2 byte-identical"
    train 2 det_plain mnist_mlp.json "${DATA[@]}" --set distributed.deterministic=true \
      --set distributed.deterministic_micro_batch=16 --set 'optimizer.lr_scaling="none"'
    ! cmp -s det_plain/model.safetensors det2/model.safetensors || fail "augmentation changed nothing"
    ;;

  bad_data)
    export_mnist png png
    SAMPLES=256 export_mnist npy npy
    IMG=(mnist_mlp.json --set 'data.dataset="image_folder"' --set "data.dir=\"$SCRATCH/png\""
         --set data.batch_size=32 --set training.epochs=1 --set data.max_test_samples=200)
    victim=png/train/3/$(ls png/train/3 | head -1)
    cp "$victim" good.png
    head -c 100 good.png >"$victim"
    launch 2 truncated "${IMG[@]}"
    expect_error truncated "$victim"
    cp good.png "$victim"
    echo "not an image" >png/train/5/garbage.png
    launch 2 garbage "${IMG[@]}"
    expect_error garbage "png/train/5/garbage.png" "not a PNG or JPEG"
    head -c 100 good.png >"$victim"
    launch 2 skipped "${IMG[@]}" --set 'data.on_bad_sample="skip"'
    [ "$RC" -eq 0 ] || { tail -5 skipped.err; fail "on_bad_sample skip did not train on"; }
    grep -h 'bad sample' skipped.err | head -2
    bad=$(sed -n 's/.*warning: \([0-9]*\) bad sample(s).*/\1/p' skipped.err | awk '{ s += $1 } END { print s }')
    [ "$bad" = 2 ] || fail "expected 2 bad samples counted over the ranks, got '$bad'"
    mv png/train/9 png/saved_9 && mkdir png/train/9
    launch 1 empty_class "${IMG[@]}"
    expect_error empty_class "png/train/9" "empty"
    rmdir png/train/9 && mv png/saved_9 png/train/9
    rm png/train/5/garbage.png
    cp good.png "$victim"
    RUN_DIR=classes train 1 classes "${IMG[@]}" --set data.max_train_samples=64
    mv png/train/9 png/train/nine && mv png/test/9 png/test/nine
    RUN_DIR=classes launch 1 classes_changed "${IMG[@]}" --set data.max_train_samples=64 --set training.epochs=2 --resume auto
    [ "$RC" -ne 0 ] || fail "a resume with other class folders was not refused"
    grep -m1 'classes of another data set' classes_changed.err | sed 's/^/  /'
    grep -q 'class 9 was "9", is "nine"' classes_changed.err || fail "the refusal does not name the changed class"
    NPY=(mnist_mlp.json --set 'data.dataset="npy"' --set "data.dir=\"$SCRATCH/npy\"" --set training.epochs=1)
    printf '\x93NUMPY\x01\x00\x10\x00{"descr": 1}   \n' >npy/test_x.npy
    launch 1 npy_header "${NPY[@]}"
    expect_error npy_header "npy/test_x.npy"
    "$EXPORT" --from synthetic_color --to "$SCRATCH/colors" --format npy --shape 1 28 28 --classes 12 \
      --train-samples 64 --test-samples 16 --max-samples 40 >export_colors.out 2>&1 ||
      fail "export of generated images failed"
    grep -q 'train_x.npy: 40/40' export_colors.out && grep -q 'test_x.npy: 16/16' export_colors.out ||
      fail "--max-samples 40 did not keep 40 of 64 generated training images and all 16 test images"
    launch 1 npy_labels mnist_mlp.json --set 'data.dataset="npy"' --set "data.dir=\"$SCRATCH/colors\""
    expect_error npy_labels "colors/train_y.npy" "outside"
    ;;

  *)
    fail "unknown case $CASE"
    ;;
esac
