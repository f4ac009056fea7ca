#!/usr/bin/env bash
# End-to-end checks of checkpoints and resume with the real `trainer` under mpirun (ctest: e2e_<case>).
#
#   checkpoint_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (MNIST subsets, so each runs in seconds; exit 77 = skipped when data/mnist is absent):
#   resume_exact_adam       2 ranks, MLP with dropout, Adam, 256 steps over 4 epochs: a run SIGKILLed
#                           between two checkpoints and resumed with --resume auto ends with weights
#                           bitwise identical to a straight run's
#   resume_exact_sgd        the same with the CNN and SGD with momentum (150 steps over 3 epochs)
#   resume_exact_syncbn     the same with resnet20 (BatchNorm) and distributed.sync_batchnorm on
#                           synthetic images: running statistics and batch counters resume too
#   resume_exact_batchnorm  the same with per-rank BatchNorm and rank 0's buffers broadcast each step
#   interrupted_write       rank 0 SIGKILLed half-way through writing a checkpoint: the previous one
#                           still loads, --resume auto picks it, and the weights still match
#   damaged_checkpoints     flipped byte, truncation, another model: auto reports each by name and
#                           reason, falls back and sets the ones passed over aside; an explicit PATH
#                           fails with one line;
#                           model.init_from takes a checkpoint's weights, and --evaluate a run's
#                           model.safetensors
#   resume_other_world_size 2 ranks -> 1 and 1 -> 2: training continues from the same sample and
#                           reaches the straight run's accuracy band; another seed mid-epoch is
#                           refused, and so are more ranks than samples left in the epoch
#   pytorch_interop         scripts/checkpoint_to_pytorch.py's accuracy == trainer --evaluate's
#                           within 0.01% (skipped without python3-torch)
#   torchvision_interop     resnet18 both ways by name: the trainer's model.safetensors loads into
#                           torchvision.models.resnet18 with strict=True, and a torchvision
#                           state_dict is taken by model.init_from (skipped without torchvision)
source "$(dirname "$0")/../e2e_common.sh"
need_mnist

# Newest checkpoint in run directory $1.
newest() { ls "$SCRATCH/$1/checkpoints"/ckpt-*.safetensors 2>/dev/null | sort | tail -1; }

# expect_killed NAME: the launch just made must have died (non-zero) rather than finished.
expect_killed() {
  [ "$RC" -ne 0 ] || fail "$1 was meant to be killed but exited 0"
  [ ! -e "$SCRATCH/$1/model.safetensors" ] || fail "$1 was meant to be killed but finished training"
}

# resumed_from NAME: the checkpoint file a --resume run says it started from.
resumed_from() { sed -n 's/^dptrain: resuming from \([^:]*\):.*/\1/p' "$1.out"; }

# A small epoch keeps CI short: 4096 samples / (2 ranks x 32) = 64 steps per epoch.
SMALL=(--set data.max_train_samples=4096 --set data.max_test_samples=2000 --set data.batch_size=32)
MLP_DROPOUT='[{"type":"flatten"},{"type":"dense","out_features":128},{"type":"relu"},{"type":"dropout","p":0.2},{"type":"dense","out_features":10}]'
# 4 epochs (256 steps), 2 in the sanitizer build (128): kills and resumes still cross an epoch end.
ADAM=(mnist_mlp.json "${SMALL[@]}" --set "model.layers=$MLP_DROPOUT" --set training.epochs="$(pick 4 2)"
      --set checkpoint.every_steps=25 --set checkpoint.every_epochs=0)

# The "epoch step" pairs of run NAME's metrics.jsonl, a line each.
epoch_steps() {
  paste -d' ' <(grep -o '"epoch":[0-9]*' "$SCRATCH/$1/metrics.jsonl" | cut -d: -f2) \
    <(grep -o '"step":[0-9]*' "$SCRATCH/$1/metrics.jsonl" | cut -d: -f2)
}

# exact_resume NAME KILL_STEP EXPECTED_CHECKPOINT_STEP CONFIG...: straight run vs killed + resumed.
exact_resume() {
  local name=$1 kill_at=$2 expect_step=$3
  shift 3
  train 2 straight "$@"
  DPTRAIN_INJECT_FAULT=1:$kill_at:kill RUN_DIR=$name launch 2 "${name}_killed" "$@"
  expect_killed "$name"
  echo "  killed after step $kill_at; checkpoints left: $(ls "$SCRATCH/$name/checkpoints" | tr '\n' ' ')"
  RUN_DIR=$name train 2 "${name}_resumed" "$@" --resume auto
  local from=$(resumed_from "${name}_resumed")
  echo "  resumed from $from"
  [ "$(basename "$from")" = "ckpt-$(printf %08d "$expect_step").safetensors" ] ||
    fail "expected to resume from step $expect_step, got '$from'"
  cmp "straight/model.safetensors" "$name/model.safetensors" || fail "resumed weights differ from the straight run's"
  echo "  final weights bitwise identical to the straight run's ($(grep -c . "$SCRATCH/$name/metrics.jsonl") metric lines)"
  # One line per epoch, as the straight run's: those the killed run wrote past the resumed step are
  # dropped by the resume (resume_exact_adam: epoch 2's, written at step 128, resumed from 125).
  [ "$(epoch_steps "$name")" = "$(epoch_steps straight)" ] ||
    fail "metrics.jsonl's (epoch, step) lines differ from the straight run's: $(epoch_steps "$name" | tr '\n' ' ')"
  # The lines the killed run wrote after its checkpoint, as the straight run's lines count them.
  local past=$(epoch_steps straight | awk -v from="$expect_step" -v k="$kill_at" '$2 > from && $2 <= k' | wc -l)
  if [ "$past" -gt 0 ]; then
    grep -q "metrics.jsonl: dropped $past line(s) past step $expect_step" "${name}_resumed.out" ||
      fail "the resume did not say it dropped the killed run's $past line(s) past step $expect_step"
  fi
  local kept=$(ls "$SCRATCH/$name/checkpoints" | grep -c '^ckpt-')
  [ "$kept" -le 3 ] || fail "checkpoint.keep 3 left $kept checkpoints"
}

case "$CASE" in
  resume_exact_adam)
    # Checkpoints every 25 steps; killed after step 137 (epoch 3), between checkpoints 125 and 150
    # (sanitizer build: after step 70, epoch 2, resumed from 50 in epoch 1).
    exact_resume adam "$(pick 137 70)" "$(pick 125 50)" "${ADAM[@]}"
    ;;

  resume_exact_sgd)
    # 3200 samples: 50 steps per epoch. Checkpoints every 20 steps; killed after step 70, so the
    # resume (from 60) crosses no checkpoint but the epoch boundary at 100 and two more checkpoints.
    # The sanitizer build: 800 samples in batches of 2 x 16, 25 steps per epoch, checkpoints every
    # 10, killed after 35, resumed from 30 across the boundary at 50; each epoch evaluates 200 test
    # samples, not 2000.
    exact_resume sgd "$(pick 70 35)" "$(pick 60 30)" mnist.json "${SMALL[@]}" --set data.max_test_samples="$(pick 2000 200)" \
      --set data.max_train_samples="$(pick 3200 800)" --set data.batch_size="$(pick 32 16)" --set training.epochs=3 \
      --set optimizer.type=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 \
      --set optimizer.schedule=cosine --set checkpoint.every_steps="$(pick 20 10)" --set checkpoint.every_epochs=0
    ;;

  resume_exact_syncbn | resume_exact_batchnorm)
    # resnet20 on 3x8x8 random images: 512 / (2 ranks x 16) = 16 steps per epoch, 2 epochs.
    # Checkpoints every 10 steps; killed after step 23, so the resume starts from 20.
    sync=$([ "$CASE" = resume_exact_syncbn ] && echo true || echo false)
    exact_resume batchnorm 23 20 mnist.json --set 'data.dataset="synthetic"' \
      --set 'data.synthetic={"samples":512,"test_samples":64}' --set data.batch_size=16 \
      --set 'model={"architecture":"resnet20","num_classes":10,"input_shape":[3,8,8]}' \
      --set optimizer.type=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set training.epochs=2 \
      --set checkpoint.every_steps=10 --set checkpoint.every_epochs=0 --set distributed.sync_batchnorm=$sync
    grep -q "BatchNorm2d(16$([ "$sync" = true ] && echo ', synchronised across ranks'))" straight.out ||
      fail "the model summary does not show BatchNorm with sync_batchnorm=$sync"
    ;;

  interrupted_write)
    train 2 straight "${ADAM[@]}"
    # Rank 0 SIGKILLs itself half-way through writing ckpt-150 (sanitizer build: ckpt-100;
    # DPTRAIN_INJECT_FAULT kind kill_in_checkpoint): the temp file is left, the rename never happened.
    cut=$(printf %08d "$(pick 150 100)") before=$(printf %08d "$(pick 125 75)")
    DPTRAIN_INJECT_FAULT=0:$((10#$cut)):kill_in_checkpoint RUN_DIR=run launch 2 killed_writing "${ADAM[@]}"
    expect_killed run
    ls -la "$SCRATCH/run/checkpoints" | sed 's/^/    /'
    [ -e "$SCRATCH/run/checkpoints/.ckpt-$cut.safetensors.tmp" ] || fail "no half-written temp file was left"
    [ ! -e "$SCRATCH/run/checkpoints/ckpt-$cut.safetensors" ] || fail "the interrupted checkpoint has its final name"
    previous=$(newest run)
    [ "$(basename "$previous")" = "ckpt-$before.safetensors" ] || fail "newest complete checkpoint is '$previous'"
    launch 1 evaluate_previous mnist_mlp.json "${SMALL[@]}" --set "model.layers=$MLP_DROPOUT" --evaluate "$previous"
    [ "$RC" -eq 0 ] || fail "the previous checkpoint does not load: $(cat evaluate_previous.err)"
    sed 's/^/  /' evaluate_previous.out
    RUN_DIR=run train 2 resumed "${ADAM[@]}" --resume auto
    [ "$(resumed_from resumed)" = "$previous" ] || fail "--resume auto picked '$(resumed_from resumed)', not $previous"
    echo "  --resume auto picked $(basename "$previous")"
    cmp straight/model.safetensors run/model.safetensors || fail "weights differ from the straight run's"
    echo "  final weights bitwise identical to the straight run's"
    [ ! -e "$SCRATCH/run/checkpoints/.ckpt-$cut.safetensors.tmp" ] || fail "the stale temp file was not cleaned up"
    ;;

  damaged_checkpoints)
    RUN=(mnist_mlp.json "${SMALL[@]}" --set training.epochs=1 --set checkpoint.every_steps=16 --set checkpoint.keep=0)
    train 2 run "${RUN[@]}"
    ls "$SCRATCH/run/checkpoints" | sed 's/^/    /'
    dir=$SCRATCH/run/checkpoints
    # Newest (64, end of training) gets one flipped byte near its end (in the weights); 48 is cut short.
    $CHECK flip-byte "$dir/ckpt-00000064.safetensors" 100
    truncate -s 5000 "$dir/ckpt-00000048.safetensors"
    RUN_DIR=run train 2 auto "${RUN[@]}" --set training.epochs=2 --resume auto
    sed 's/^/    /' auto.err
    grep -q "skipping checkpoint: $dir/ckpt-00000064.safetensors: .*checksum mismatch" auto.err ||
      fail "the flipped byte in ckpt-64 was not reported by name and reason"
    grep -q "skipping checkpoint: $dir/ckpt-00000048.safetensors: " auto.err || fail "the truncated ckpt-48 was not reported"
    [ "$(resumed_from auto)" = "$dir/ckpt-00000032.safetensors" ] || fail "auto did not fall back to ckpt-32"
    echo "  --resume auto fell back to ckpt-00000032.safetensors"
    # The two it passed over are set aside: with their higher steps they would outrank the run's own.
    grep "set aside" auto.out | sed 's/^/    /'
    grep -q "set aside 2 checkpoint(s) past step 32 in $dir as set-aside-[0-9T]*Z-ckpt-\*" auto.out ||
      fail "no line saying that ckpt-48 and ckpt-64 were set aside"
    [ "$(ls "$dir" | grep -c '^set-aside-[0-9T]*Z-ckpt-000000[46][48]\.safetensors$')" -eq 2 ] ||
      fail "the checkpoints passed over were not renamed: $(ls "$dir")"
    [ "$(basename "$(newest run)")" = ckpt-00000128.safetensors ] || fail "the resumed run's last checkpoint is $(newest run)"

    # An explicit PATH to a damaged file: non-zero exit, one line naming the file and the problem.
    cp "$dir/ckpt-00000032.safetensors" good.safetensors
    $CHECK flip-byte good.safetensors 100
    RUN_DIR=explicit launch 2 explicit "${RUN[@]}" --resume "$SCRATCH/good.safetensors"
    [ "$RC" -ne 0 ] || fail "--resume of a damaged file exited 0"
    grep -q "dptrain: error on rank 0: $SCRATCH/good.safetensors: tensor data checksum mismatch" explicit.err ||
      fail "the error does not name the file and the problem: $(cat explicit.err)"
    echo "  explicit damaged PATH: exit $RC, $(grep -m1 'dptrain: error' explicit.err)"

    # A checkpoint of another model: rejected naming the tensor; with auto and nothing usable, the
    # run stops rather than start afresh among unusable checkpoints.
    WIDER=(--set 'model.layers=[{"type":"flatten"},{"type":"dense","out_features":64},{"type":"relu"},{"type":"dense","out_features":10}]')
    RUN_DIR=run launch 2 other_model "${RUN[@]}" "${WIDER[@]}" --resume "$dir/ckpt-00000032.safetensors"
    [ "$RC" -ne 0 ] || fail "a checkpoint of another model was accepted"
    grep -q "tensor '1.weight' has shape \[128, 784\] but the configured model's is \[64, 784\]" other_model.err ||
      fail "the shape mismatch is not named: $(cat other_model.err)"
    echo "  another model: $(grep -m1 'dptrain: error' other_model.err)"
    RUN_DIR=run launch 2 other_model_auto "${RUN[@]}" "${WIDER[@]}" --resume auto
    [ "$RC" -ne 0 ] || fail "--resume auto started afresh among unusable checkpoints"
    grep -q "none of the .* checkpoint(s) in $dir can be used" other_model_auto.err || fail "$(cat other_model_auto.err)"

    # model.init_from takes a checkpoint's weights (only those): after one step at lr 0 they are
    # unchanged, so both checkpoints evaluate to the same loss and count.
    source_ckpt=$dir/ckpt-00000032.safetensors
    train 2 init_from "${RUN[@]}" --set training.max_steps=1 --set optimizer.lr=0 --set "model.init_from=\"$source_ckpt\""
    launch 1 evaluate_source "${RUN[@]}" --evaluate "$source_ckpt"
    launch 1 evaluate_init_from "${RUN[@]}" --evaluate "$(newest init_from)"
    a=$(sed -n 's/.*: \(test loss .* correct\).*/\1/p' evaluate_source.out)
    b=$(sed -n 's/.*: \(test loss .* correct\).*/\1/p' evaluate_init_from.out)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "init_from a checkpoint: '$a' vs '$b'"
    echo "  model.init_from a checkpoint evaluates as its source: $b)"
    # --evaluate also takes the weights alone, the run's model.safetensors (no checkpoint metadata).
    launch 1 evaluate_final "${RUN[@]}" --evaluate "$SCRATCH/init_from/model.safetensors"
    c=$(sed -n 's/.*: \(test loss .* correct\).*/\1/p' evaluate_final.out)
    [ "$RC" -eq 0 ] && [ "$c" = "$a" ] || fail "--evaluate model.safetensors: '$c' vs '$a': $(cat evaluate_final.err)"
    ;;

  resume_other_world_size)
    # 8192 samples, batch 64 per rank, 2 epochs. Straight on 2 ranks; then 2 ranks stopped at step
    # 80 (epoch 2, sample 2048) and resumed on 1 rank, and the reverse. The world size changes the
    # global batch (128 vs 64), the steps and the scaled LR, so weights differ; accuracy must stay in
    # the straight run's band (within 1.5 points), and the resume must start at the same sample.
    RUN=(mnist_mlp.json --set data.max_train_samples=8192 --set data.batch_size=64 --set training.epochs=2)
    train 2 straight "${RUN[@]}"
    RUN_DIR=two_then_one train 2 two_then_one_a "${RUN[@]}" --set training.max_steps=80
    # Mid-epoch, another seed would draw another permutation for the rest of the epoch: refused.
    RUN_DIR=two_then_one launch 1 other_seed "${RUN[@]}" --set seed=7 \
      --resume "$SCRATCH/two_then_one/checkpoints/ckpt-00000080.safetensors"
    [ "$RC" -ne 0 ] || fail "a mid-epoch resume with another seed was accepted"
    grep -q "written mid-epoch (sample 2048 of epoch 2) by a run that sampled otherwise: seed 42 then, 7 now" \
      other_seed.err || fail "the error does not name the seed: $(cat other_seed.err)"
    # A position past the training set configured now: refused, naming the keys that set its size.
    RUN_DIR=two_then_one launch 1 fewer_samples "${RUN[@]}" --set data.max_train_samples=1024 \
      --resume "$SCRATCH/two_then_one/checkpoints/ckpt-00000080.safetensors"
    [ "$RC" -ne 0 ] || fail "a position past the training set was accepted"
    grep -q "lies beyond the 1024 training samples configured now; resume with the data.dir and data.max_train_samples" \
      fewer_samples.err || fail "the refusal does not name the keys: $(cat fewer_samples.err)"
    RUN_DIR=two_then_one train 1 two_then_one_b "${RUN[@]}" --resume auto
    # 129 samples in batches of 64 on one rank, stopped after step 2: one sample left in the epoch,
    # too few for 2 ranks, each of which needs one. Refused, rather than failing in the step.
    near_end=(mnist_mlp.json --set data.max_train_samples=129 --set data.batch_size=64 --set training.epochs=1)
    train 1 near_end "${near_end[@]}" --set training.max_steps=2
    RUN_DIR=near_end_two launch 2 near_end_two "${near_end[@]}" \
      --resume "$SCRATCH/near_end/checkpoints/ckpt-00000002.safetensors"
    [ "$RC" -ne 0 ] || fail "a resume with fewer samples left in the epoch than ranks was accepted"
    grep -q "its position leaves 1 sample(s) of epoch 1, fewer than the 2 ranks of this run" near_end_two.err ||
      fail "the refusal does not say why: $(cat near_end_two.err)"
    RUN_DIR=one_then_two train 1 one_then_two_a "${RUN[@]}" --set training.max_steps=160
    RUN_DIR=one_then_two train 2 one_then_two_b "${RUN[@]}" --resume auto
    grep -h "resuming from" two_then_one_b.out one_then_two_b.out | sed 's/^/    /'
    grep -q "epoch 2 at sample 2048 of 8192 (written on 2 rank(s) x batch 64, now 1 rank(s) x batch 64" two_then_one_b.out ||
      fail "2 -> 1 did not resume at sample 2048 of epoch 2"
    grep -q "epoch 2 at sample 2048 of 8192 (written on 1 rank(s) x batch 64, now 2 rank(s) x batch 64" one_then_two_b.out ||
      fail "1 -> 2 did not resume at sample 2048 of epoch 2"
    declare -A acc
    for run in straight two_then_one one_then_two; do acc[$run]=$($CHECK metric $run/metrics.jsonl test_accuracy); done
    echo "  final test accuracy: straight ${acc[straight]}, 2 -> 1 ${acc[two_then_one]}, 1 -> 2 ${acc[one_then_two]}"
    small && { echo "PASS: $CASE (the accuracy band is checked in the Release build)"; exit 0; }
    for run in two_then_one one_then_two; do
      awk -v a="${acc[straight]}" -v b="${acc[$run]}" 'BEGIN { d = a - b; exit !(d <= 0.015 && -d <= 0.015) }' ||
        fail "$run left the straight run's accuracy band"
    done
    ;;

  pytorch_interop)
    PY=/usr/bin/python3  # PyTorch interop is the one test that needs Python: PyTorch itself
    if ! $PY -c "import torch, numpy" 2>/dev/null; then
      echo "SKIP: python3-torch / python3-numpy are not installed (scripts/setup.sh --with-torch)"
      exit 77
    fi
    # The CNN, one short epoch on 2 ranks; then the final checkpoint evaluated on the test set (all
    # 10,000 images; the first 1000 in the sanitizer build) by the trainer and by PyTorch.
    RUN=(mnist.json --set data.max_train_samples=4096 --set data.batch_size=64 --set training.epochs=1)
    train 2 cnn "${RUN[@]}"
    ckpt=$(newest cnn)
    launch 2 evaluate "${RUN[@]}" --evaluate "$ckpt"
    [ "$RC" -eq 0 ] || fail "trainer --evaluate failed: $(cat evaluate.err)"
    $PY "$SRC/scripts/checkpoint_to_pytorch.py" "$ckpt" --data-dir "$MNIST_DIR" --save cnn.pt >torch.out ||
      fail "checkpoint_to_pytorch.py failed"
    sed 's/^/  /' evaluate.out torch.out
    # "(848 of 1000 correct" -> "848 1000"
    read -r ours total < <(sed -n 's/.*(\([0-9]*\) of \([0-9]*\) correct.*/\1 \2/p' evaluate.out)
    read -r theirs theirs_total < <(sed -n 's/.*(\([0-9]*\) of \([0-9]*\) correct.*/\1 \2/p' torch.out)
    [ -n "$ours" ] && [ -n "$theirs" ] || fail "could not read both accuracies"
    [ "$total" = "$(pick 10000 1000)" ] && [ "$theirs_total" = "$total" ] ||
      fail "expected both to evaluate $(pick 10000 1000) images, got $total (trainer) and $theirs_total (PyTorch)"
    # 0.01% of 10,000 images is one image; of 1000, still at most one.
    diff=$((ours > theirs ? ours - theirs : theirs - ours))
    [ "$diff" -le 1 ] || fail "accuracy differs by $diff images of $total (> 0.01% or one image)"
    echo "  trainer $ours vs PyTorch $theirs correct of $total: difference $diff image(s)"
    ;;

  torchvision_interop)
    PY=/usr/bin/python3
    if ! $PY -c "import torch, torchvision" 2>/dev/null; then
      echo "SKIP: python3-torchvision is not installed (scripts/setup.sh --with-torch)"
      exit 77
    fi
    # resnet18 at 3x32x32 (conv1 and the stem as torchvision's), 10 classes, two steps on synthetic
    # images; the safetensors reader and writer are the fixture script's, independent of ours.
    R18=(mnist.json --set 'data.dataset="synthetic"' --set 'data.synthetic={"samples":32,"test_samples":16}'
         --set data.batch_size=16 --set training.epochs=1)
    MODEL='"architecture":"resnet18","num_classes":10,"input_shape":[3,32,32]'
    train 1 ours "${R18[@]}" --set "model={$MODEL}"
    cat >interop.py <<'PYTHON'
import sys
import torch
import torchvision
sys.path.insert(0, sys.argv[1])
from make_fixtures import randomize_batchnorm, read_safetensors, write_safetensors

def resnet18():
    return torchvision.models.resnet18(num_classes=10)

def load(path):
    tensors, _ = read_safetensors(path)
    return {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}

if sys.argv[2] == "ours-to-torchvision":
    state = load("ours/model.safetensors")
    model = resnet18()
    model.load_state_dict(state, strict=True)  # every key, shape and dtype, buffers included
    assert model.bn1.num_batches_tracked.dtype == torch.int64 and int(model.bn1.num_batches_tracked) == 2
    print(f"  torchvision resnet18 loaded {len(state)} tensors with strict=True (num_batches_tracked 2)")
elif sys.argv[2] == "write-torchvision":
    torch.manual_seed(7)
    model = resnet18()
    randomize_batchnorm(model)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.num_batches_tracked.fill_(5)
    write_safetensors("torchvision.safetensors", model.state_dict(), {"source": "torchvision"})
else:  # compare: one step at lr 0 moved no parameter; BatchNorm counted one more batch
    ref, ours = load("torchvision.safetensors"), load("init/model.safetensors")
    assert ref.keys() == ours.keys(), set(ref) ^ set(ours)
    params = dict(resnet18().named_parameters())
    for k in params:
        assert torch.equal(ref[k], ours[k]), f"{k} differs from torchvision's"
    counters = [k for k in ref if k.endswith("num_batches_tracked")]
    for k in counters:
        assert ours[k].dtype == torch.int64 and int(ours[k]) == 6, f"{k}: {ours[k]}"
    print(f"  model.init_from took torchvision's {len(ref)} tensors: {len(params)} parameters bitwise, "
          f"{len(counters)} batch counters 5 -> 6")
PYTHON
    $PY interop.py "$SRC/tests/fixtures" ours-to-torchvision || fail "torchvision could not load model.safetensors"
    $PY interop.py "$SRC/tests/fixtures" write-torchvision || fail "could not write torchvision's state_dict"
    train 1 init "${R18[@]}" --set "model={$MODEL,\"init_from\":\"$SCRATCH/torchvision.safetensors\"}" \
      --set training.max_steps=1 --set optimizer.lr=0 --set optimizer.type=sgd --set optimizer.momentum=0
    $PY interop.py "$SRC/tests/fixtures" compare || fail "model.init_from did not take torchvision's weights"
    ;;

  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
