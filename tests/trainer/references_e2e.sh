#!/usr/bin/env bash
# End-to-end checks of the trainer against references outside it: closed forms, direct counts and
# constructions where the right answer is known without running the trainer twice (ctest: e2e_<case>).
#
#   references_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (exit 77 = skipped when data/mnist is absent):
#   lr_per_step        the LR of each step in metrics.jsonl against the schedule's formula: linear
#                      scaling by ranks x backward passes, warmup, cosine to min_lr, at 2 ranks x 2
#                      passes, with the schedule's position counted in batches
#   evaluation_chunks  a test set that is not a multiple of eval_batch_size (1500 in chunks of 1000):
#                      the count of correct predictions is the one of a direct count (chunks of 1),
#                      on 1 and 2 ranks
#   dropout_per_rank   every sample identical: 2 ranks x 1 equal 1 rank x 1 bit for bit when dropout
#                      is off, and differ when it is on, since each rank draws its own mask
#   buffers_per_rank   per-rank BatchNorm at 2 ranks: the test figures the run reports are those of
#                      the checkpoint it wrote, evaluated on 1 rank (every rank evaluates rank 0's
#                      running statistics)
source "$(dirname "$0")/../e2e_common.sh"

case "$CASE" in
  lr_per_step)
    need_mnist
    # 256 samples / (2 ranks x 32 x 2 passes) = 2 steps per epoch; metrics.jsonl has each epoch's
    # last step, at position e - 1/2 of the schedule (2 of its 4 batches done).
    train 2 run mnist_mlp.json --set data.max_train_samples=256 --set data.max_test_samples=100 \
      --set data.batch_size=32 --set distributed.backward_passes_per_step=2 --set training.epochs=6 \
      --set optimizer.type=sgd --set optimizer.lr=0.01 --set optimizer.lr_scaling=linear \
      --set optimizer.warmup_epochs=2 --set optimizer.schedule=cosine --set optimizer.min_lr=0.001
    # Scaled LR 0.01 x 2 x 2 = 0.04. Warmup (Horovod's): 0.04 / 2 x ((2 - 1) / 2 x t + 1) for t < 2;
    # then 0.001 + (0.04 - 0.001) / 2 x (1 + cos(pi (t - 2) / 4)).
    awk -F'"lr":' 'NF > 1 {
        split($2, v, /[,}]/); lr = v[1]; e = NR; t = e - 0.5
        pi = atan2(0, -1)
        want = t < 2 ? 0.04 / 2 * (0.5 * t + 1) : 0.001 + 0.039 * 0.5 * (1 + cos(pi * (t - 2) / 4))
        err = lr - want; if (err < 0) err = -err
        printf "  epoch %d step %d (t = %.2f): lr %.9g, formula %.9g\n", e, 2 * e, t, lr, want
        if (err > 1e-9 * want) bad = 1
        n = NR
      } END { exit bad || n != 6 }' run/metrics.jsonl || fail "the LR per step differs from the schedule's formula"
    ;;

  evaluation_chunks)
    need_mnist
    RUN=(mnist_mlp.json --set data.max_train_samples=1024 --set data.max_test_samples=1500 --set data.batch_size=64
         --set training.epochs=1 --set training.max_steps=5)
    train 1 run "${RUN[@]}"
    ckpt=$(ls "$SCRATCH"/run/checkpoints/ckpt-*.safetensors | tail -1)
    # A direct count: one sample per chunk, so no chunking rule is involved.
    launch 1 direct "${RUN[@]}" --set data.eval_batch_size=1 --evaluate "$ckpt"
    [ "$RC" -eq 0 ] || fail "evaluation in chunks of 1 failed: $(cat direct.err)"
    count() { sed -n 's/.*: test loss \([0-9.]*\), accuracy .* (\([0-9]*\) of \([0-9]*\) correct.*/\2 of \3 (loss \1)/p' "$1.out"; }
    direct=$(count direct)
    echo "  direct count, chunks of 1: $direct correct"
    [[ "$direct" == *" of 1500 "* ]] || fail "the direct count did not see 1500 samples: '$direct'"
    for np in 1 2; do
      launch $np chunked_np$np "${RUN[@]}" --set data.eval_batch_size=1000 --evaluate "$ckpt"
      [ "$RC" -eq 0 ] || fail "evaluation in chunks of 1000 on $np rank(s) failed"
      echo "  chunks of 1000 on $np rank(s): $(count chunked_np$np) correct"
      [ "$(count chunked_np$np)" = "$direct" ] || fail "chunks of 1000 on $np rank(s) count '$(count chunked_np$np)', not '$direct'"
    done
    ;;

  dropout_per_rank)
    # Four identical 28x28 images (pixel i is 7i mod 256) labelled 3, as MNIST-layout IDX files.
    mkdir -p same
    image=$(for ((i = 0; i < 784; i++)); do printf '\\%03o' $((7 * i % 256)); done)
    for prefix in train t10k; do
      { printf '\0\0\10\3\0\0\0\4\0\0\0\34\0\0\0\34'; for _ in 1 2 3 4; do printf "$image"; done; } >same/$prefix-images-idx3-ubyte
      printf '\0\0\10\1\0\0\0\4\3\3\3\3' >same/$prefix-labels-idx1-ubyte
    done
    [ "$(stat -c %s same/train-images-idx3-ubyte)" -eq $((16 + 4 * 784)) ] || fail "the IDX file came out wrong"
    for p in 0 0.5; do
      MODEL="[{\"type\":\"flatten\"},{\"type\":\"dense\",\"out_features\":64},{\"type\":\"relu\"},{\"type\":\"dropout\",\"p\":$p},{\"type\":\"dense\",\"out_features\":10}]"
      ONE_STEP=(mnist_mlp.json --set "data.dir=\"$SCRATCH/same\"" --set "model.layers=$MODEL" --set data.batch_size=1
                --set training.epochs=1 --set training.max_steps=1 --set optimizer.type=sgd --set optimizer.lr=0.5
                --set optimizer.lr_scaling=none)
      train 1 np1_p$p "${ONE_STEP[@]}"
      train 2 np2_p$p "${ONE_STEP[@]}"
    done
    # Without dropout both ranks' gradients equal rank 0's alone, and their mean is exact.
    cmp np1_p0/model.safetensors np2_p0/model.safetensors || fail "without dropout 2 ranks differ from 1 on identical samples"
    # With it, rank 1 draws its own mask: a mask shared by the ranks would give 1 rank's weights again.
    ! cmp -s np1_p0.5/model.safetensors np2_p0.5/model.safetensors ||
      fail "with dropout 2 ranks equal 1 rank on identical samples: every rank drew rank 0's mask"
    echo "  identical samples: np 2 == np 1 bitwise with p = 0; they differ with p = 0.5 (a mask per rank)"
    ;;

  buffers_per_rank)
    # resnet20 on 3x8x8 random images, per-rank BatchNorm (rank 0's buffers broadcast), 2 ranks.
    RESNET=(mnist.json --set 'data.dataset="synthetic"' --set 'data.synthetic={"samples":256,"test_samples":64}'
            --set data.batch_size=16 --set 'model={"architecture":"resnet20","num_classes":10,"input_shape":[3,8,8]}'
            --set optimizer.type=sgd --set optimizer.lr=0.05 --set training.epochs=1
            --set distributed.sync_batchnorm=false --set distributed.broadcast_buffers=true)
    train 2 run "${RESNET[@]}"
    reported=$(sed -n 's/^epoch 1: .*| test loss \([0-9.]*\) acc \([0-9.]*%\).*/loss \1 acc \2/p' run.out)
    ckpt=$(ls "$SCRATCH"/run/checkpoints/ckpt-*.safetensors | tail -1)
    launch 1 evaluate "${RESNET[@]}" --evaluate "$ckpt"
    [ "$RC" -eq 0 ] || fail "evaluating $ckpt failed: $(cat evaluate.err)"
    evaluated=$(sed -n 's/.*: test loss \([0-9.]*\), accuracy \([0-9.]*%\).*/loss \1 acc \2/p' evaluate.out)
    echo "  reported by the 2-rank run: $reported; its checkpoint on 1 rank: $evaluated"
    [ -n "$reported" ] && [ "$reported" = "$evaluated" ] ||
      fail "the 2-rank run reported '$reported' but its checkpoint evaluates to '$evaluated'"
    ;;

  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
