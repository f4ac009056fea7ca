#!/usr/bin/env bash
# End-to-end checks of the experiment scripts and benchmark tools (ctest: e2e_<case>), kept short:
# they check that the scripts produce their outputs, not the figures (those are in docs/results.md and
# come from full runs).
#
#   scripts_e2e.sh CASE TRAINER SOURCE_DIR SCRATCH_DIR [MPIEXEC]
#
# Cases (exit 77 = skipped when data/mnist, gnuplot or network namespaces are unavailable):
#   scaling_sweep   scripts/scaling.sh at 1 and 2 ranks, fp32 and fp16: CSV rows, two PNG plots, the
#                   model's prediction table and extrapolation; then with a resnet20 config, whose
#                   measured step the extrapolation takes
#   netns_scaling   scripts/netns_scaling.sh with one throttled rate (1 Gbit/s: 100 Mbit/s took 35 s more
#                   for the same code path): 2 ranks in separate network
#                   namespaces over TCP, and the model's prediction for them
#   synthetic_benchmark  bench/synthetic_benchmark (Horovod's synthetic benchmark) on 1 and 2 ranks
#                   with a small resnet20: Horovod's output lines and the RESULT line, whose median
#                   of 3 and of 4 iterations is checked
#   machine_probe   bench/machine_probe: memcpy and GEMM figures, a load that stops at SIGTERM and
#                   reports what it streamed; train_bench's FLOPs per sample for the MNIST CNN,
#                   and its --profile-ops count of them
source "$(dirname "$0")/../e2e_common.sh"
need_mnist
BUILD=$(dirname "$TRAINER")  # the trainer sits at the top of the build directory

case "$CASE" in
  scaling_sweep)
    command -v gnuplot >/dev/null || { echo "SKIP: gnuplot is missing (scripts/setup.sh installs gnuplot-nox)"; exit 77; }
    # A misspelt compression is refused before the first run, in one line.
    bash "$SRC/scripts/scaling.sh" --build "$BUILD" --compression "none fp17" --out "$SCRATCH/typo" >typo.out 2>&1
    rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l <typo.out)" -eq 1 ] && grep -q "^scaling.sh: compression fp17, fusion 0: .*not one of" typo.out &&
      [ ! -e "$SCRATCH/typo/results.jsonl" ] || { cat typo.out; fail "a misspelt compression was not refused at once (exit $rc)"; }
    bash "$SRC/scripts/scaling.sh" --build "$BUILD" --set "data.dir=\"$MNIST_DIR\"" --max-ranks 2 \
      --compression "none fp16 powersgd" --fusion 4 \
      --warmup 2 --steps 4 --reps 1 --out "$SCRATCH/sweep" >sweep.out 2>&1 || { cat sweep.out; fail "scaling.sh failed"; }
    sed 's/^/  /' sweep.out | tail -30
    [ "$(wc -l <"$SCRATCH/sweep/scaling.csv")" -eq 5 ] || fail "expected a header and 4 rows in scaling.csv"
    grep -q "^machine: .*core(s)" "$SCRATCH/sweep/model.txt" || fail "model.txt does not name the machine"
    # PowerSGD's row: measured, but not predicted by the ring's model.
    grep -q "^ *2 *powersgd .*(not modelled)$" "$SCRATCH/sweep/model.txt" || fail "no unmodelled powersgd row"
    awk -F, '$1 == 2 && $2 == "powersgd" { found = 1; ok = $4 > 0 && $12 == "" } END { exit !(found && ok) }' \
      "$SCRATCH/sweep/scaling.csv" || fail "the powersgd row should have a rate and no prediction"
    head -1 "$SCRATCH/sweep/scaling.csv" | grep -q "^ranks,compression,fusion_mb,samples_per_sec,efficiency" ||
      fail "unexpected CSV header"
    # The last column, the CPU time per step, is there and measured in every row (lines end in \r\n).
    awk -F, 'NR == 1 { ok = ($NF == "cpu_ms\r") } NR > 1 { ok = ok && $NF + 0 > 0 } END { exit !ok }' \
      "$SCRATCH/sweep/scaling.csv" || fail "scaling.csv has no cpu_ms column, or a row without a positive one"
    for png in throughput efficiency; do
      [ "$(head -c 4 "$SCRATCH/sweep/$png.png" | od -An -tx1 | tr -d ' ')" = 89504e47 ] || fail "$png.png is not a PNG"
    done
    grep -q "prediction against measurement" "$SCRATCH/sweep/model.txt" || fail "no prediction table"
    grep -q "ResNet-50" "$SCRATCH/sweep/model.txt" || fail "no ResNet-50 extrapolation"
    # A ResNet config: the model's extrapolation uses its own measured step and buckets.
    cat >resnet20.json <<'JSON'
{"seed": 1, "data": {"dataset": "synthetic", "batch_size": 8, "synthetic": {"samples": 64, "test_samples": 8}},
 "model": {"architecture": "resnet20", "num_classes": 10, "input_shape": [3, 8, 8]},
 "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}}
JSON
    bash "$SRC/scripts/scaling.sh" --build "$BUILD" --config "$SCRATCH/resnet20.json" --max-ranks 2 --compression none \
      --fusion 4 --warmup 1 --steps 2 --reps 1 --out "$SCRATCH/resnet" >resnet.out 2>&1 ||
      { cat resnet.out; fail "scaling.sh --config resnet20.json failed"; }
    grep "resnet20 of" "$SCRATCH/resnet/model.txt" | sed 's/^/  /'
    grep -q "resnet20 of .*resnet20.json (272,474 parameters" "$SCRATCH/resnet/model.txt" ||
      fail "the extrapolation does not use the swept resnet20"
    ;;
  netns_scaling)
    bash "$SRC/scripts/netns_scaling.sh" --build "$BUILD" --set "data.dir=\"$MNIST_DIR\"" --rates 1gbit --steps 3 \
      --allreduce-seconds 0.02 --out "$SCRATCH/netns" >netns.out 2>&1
    rc=$?
    sed 's/^/  /' netns.out
    [ $rc -eq 77 ] && exit 77
    [ $rc -eq 0 ] || fail "netns_scaling.sh exited with $rc"
    grep -q "largest prediction error" "$SCRATCH/netns/1gbit/model.txt" || fail "no prediction for the throttled link"
    ;;
  compression_netns)
    [ -d "$MNIST_DIR" ] || { echo "SKIP: data/mnist is absent"; exit 77; }
    # One short epoch per mode at 100 Mbit/s, twice: the table of medians, the plot data and the bytes ratio.
    bash "$SRC/scripts/compression_netns.sh" --build "$BUILD" --rates 100mbit --modes "none powersgd:2" --epochs 1 --repeats 2 \
      --target 0.5 --set data.max_train_samples=2048 --set data.max_test_samples=500 \
      --set distributed.powersgd.start_step=0 --out "$SCRATCH/compression" >compression.out 2>&1
    rc=$?
    sed 's/^/  /' compression.out
    [ $rc -eq 77 ] && exit 77
    [ $rc -eq 0 ] || fail "compression_netns.sh exited with $rc"
    results=$SCRATCH/compression/results.tsv
    [ "$(wc -l <"$results")" -eq 5 ] || fail "expected 4 rows (2 modes x 2 repeats) in results.tsv"
    none=$(awk -F'\t' '$2 == "none" && $3 == 2 { print $4 }' "$results")
    powersgd=$(awk -F'\t' '$2 == "powersgd:2" && $3 == 2 { print $4 }' "$results")
    awk -v a="$none" -v b="$powersgd" 'BEGIN { exit !(b > 0 && a / b > 8) }' ||
      fail "powersgd sent $powersgd bytes per step against $none uncompressed (expected > 8x fewer)"
    grep -q "^Medians of 2 interleaved runs" "$SCRATCH/compression/table.md" || fail "table.md does not say it holds medians"
    [ "$(grep -c "^| 100mbit | powersgd:2 |" "$SCRATCH/compression/table.md")" -eq 1 ] ||
      fail "expected one powersgd row in table.md"
    [ -s "$SCRATCH/compression/100mbit/powersgd_rank2/repeat2/curve.dat" ] || fail "no curve data"
    # --summarize-only (last, as the usage line has it) rebuilds the same rows; one that names a mode
    # never run fails and leaves results.tsv as it was.
    cp "$results" results.before
    bash "$SRC/scripts/compression_netns.sh" --rates 100mbit --modes "none powersgd:2" --repeats 2 --target 0.5 \
      --out "$SCRATCH/compression" --summarize-only >summary.out 2>&1 || { cat summary.out; fail "--summarize-only failed"; }
    cmp -s results.before "$results" || fail "--summarize-only rebuilt other rows than the runs wrote"
    bash "$SRC/scripts/compression_netns.sh" --rates 100mbit --modes "none fp16" --repeats 2 \
      --out "$SCRATCH/compression" --summarize-only >missing.out 2>&1 && fail "--summarize-only of a mode never run passed"
    cmp -s results.before "$results" && [ ! -e "$results.new" ] ||
      fail "a failed --summarize-only changed results.tsv or left results.tsv.new"
    ;;
  synthetic_benchmark)
    for np in 1 2; do
      iters=$((np + 2))  # an odd count and an even one, whose median is the mean of the middle two
      cmd=("$BUILD/bench/synthetic_benchmark" --model resnet20 --input-shape 3,8,8 --batch-size 8 --num-classes 10
           --threads 1 --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters "$iters"
           --set "output_dir=\"$SCRATCH/np$np\"")
      [ "$np" -gt 1 ] && cmd=("$MPIEXEC" -np "$np" --oversubscribe "${cmd[@]}")
      "${cmd[@]}" >np$np.out 2>&1 || { cat np$np.out; fail "synthetic_benchmark on $np rank(s) failed"; }
      grep -v '^RESULT' np$np.out | sed 's/^/  /'
      grep -q "^Number of CPUs: $np (threads per process: 1)$" np$np.out || fail "no 'Number of CPUs: $np' line"
      [ "$(grep -c '^Iter #[0-9]: [0-9.]* img/sec per CPU$' np$np.out)" -eq "$iters" ] ||
        fail "expected $iters 'Iter #' lines"
      rates=$(sed -n 's/^RESULT .*"img_per_sec":\[\([^]]*\)\].*/\1/p' np$np.out | tr ',' '\n' | sort -g)
      median=$(sed -n 's/^RESULT .*"img_per_sec_median":\([0-9.e+-]*\).*/\1/p' np$np.out)
      [ "$(wc -l <<<"$rates")" -eq "$iters" ] || fail "expected $iters rates in RESULT's img_per_sec"
      awk -v n="$iters" -v median="$median" '{ r[NR] = $1 }
        END { m = n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2; exit !(m > 0 && (median - m)^2 <= (1e-9 * m)^2) }' \
        <<<"$rates" || fail "img_per_sec_median $median is not the median of [$(echo $rates)]"
      grep -q '^Img/sec per CPU: [0-9.]* +-[0-9.]*$' np$np.out || fail "no 'Img/sec per CPU' line"
      grep -q "^Total img/sec on $np CPU(s): [0-9.]* +-[0-9.]*$" np$np.out || fail "no 'Total img/sec' line"
      grep -q "^RESULT {.*\"ranks\":$np" np$np.out || fail "no RESULT line for $np rank(s)"
      # CPU time per step against the wall time per step: one compute thread can't take more than
      # the step's time (plus the loader's and the reduction's slivers), and it takes some.
      cpu=$(sed -n 's/^RESULT .*"cpu_ms_per_step":\([0-9.e+-]*\).*/\1/p' np$np.out)
      wall=$(sed -n 's/^RESULT .*"total":\([0-9.e+-]*\).*/\1/p' np$np.out)
      awk -v cpu="$cpu" -v wall="$wall" 'BEGIN { exit !(cpu > 0 && cpu <= 1.5 * wall) }' ||
        fail "cpu_ms_per_step '$cpu' is not in (0, 1.5 x the step's $wall ms]"
      # Horovod's fixed batch (the default) against the loader every step (--data-path): the same
      # samples in the same order, so the same losses to the bit; only the second spends time in data.
      "${cmd[@]}" --data-path >path$np.out 2>&1 || { cat path$np.out; fail "--data-path on $np rank(s) failed"; }
      field() { sed -n "s/^RESULT .*\"$1\":\([^,}]*\).*/\1/p" "$2"; }
      [ "$(field data_path np$np.out)" = false ] && [ "$(field data_path path$np.out)" = true ] ||
        fail "RESULT's data_path: expected false by default and true with --data-path"
      [ "$(field data np$np.out)" = 0.0 ] || fail "a fixed batch spent $(field data np$np.out) ms a step in data"
      awk -v d="$(field data path$np.out)" 'BEGIN { exit !(d > 0) }' || fail "--data-path spent no time in data"
      loss=$(field mean_loss np$np.out)
      awk -v l="$loss" 'BEGIN { exit !(l > 0 && l < 10) }' || fail "mean_loss '$loss' is not a cross-entropy of 10 classes"
      [ "$loss" = "$(field mean_loss path$np.out)" ] ||
        fail "mean_loss: fixed batch $loss, --data-path $(field mean_loss path$np.out) on $np rank(s)"
      echo "  $np rank(s): mean loss $loss with the batch kept and with --data-path"
    done
    # More than one batch per rank (2 at np 2), or a shuffled one: training on the first again would
    # not be the same math.
    if "${cmd[@]}" --set data.synthetic.samples=32 >several.out 2>&1; then
      fail "a fixed batch over 2 batches per epoch ran"
    fi
    grep -q 'fixed batch needs the same batch at every step.* has 2 batch(es) per epoch, .*--data-path' several.out ||
      { cat several.out; fail "no clear error for a fixed batch over 2 batches per epoch"; }
    if "${cmd[@]}" --set data.shuffle=true >shuffled.out 2>&1; then
      fail "a fixed batch with data.shuffle ran"
    fi
    grep -q 'fixed batch needs the same batch at every step.* shuffle true,' shuffled.out ||
      { cat shuffled.out; fail "no clear error for a fixed batch with data.shuffle"; }
    # --profile-ops against a count by hand. resnet20 at 3x8x8, multiply-adds per sample: conv1 3->16
    # at 8x8 27,648; stage 1, six 16->16 at 8x8, 884,736; stage 2 (4x4) 73,728 + 147,456 + the 1x1
    # shortcut 8,192 + four 32->32 589,824; stage 3 (2x2) the same 819,200; fc 640: 2,551,424. A
    # step of 8 samples does 6 FLOPs per multiply-add (forward, both gradients) less conv1's input
    # gradient (2 x 27,648): 8 x (15,308,544 - 55,296) = 122,025,984 FLOPs, in 21 convolutions.
    "$BUILD/bench/synthetic_benchmark" --model resnet20 --input-shape 3,8,8 --batch-size 8 --num-classes 10 \
      --threads 1 --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2 --profile-ops --gemm-gflops 100 \
      --set "output_dir=\"$SCRATCH/profile\"" >profile.out 2>&1 || { cat profile.out; fail "--profile-ops failed"; }
    sed -n '/^Per-op profile/,/^Convolutions by shape/p' profile.out | sed 's/^/  /'
    grep -q '"flops_per_step":122025984.0[,}]' profile.out ||
      fail "--profile-ops: expected 122025984 FLOPs per step, got $(grep -o '"flops_per_step":[0-9.e+]*' profile.out)"
    calls=$(grep '^RESULT' profile.out | grep -o '"conv [^"]*":[0-9.]*' | paste -sd' ')
    [ "$calls" = '"conv 1x1/2 bwd":2.0 "conv 1x1/2 fwd":2.0 "conv 3x3/1 bwd":17.0 "conv 3x3/1 fwd":17.0 "conv 3x3/2 bwd":2.0 "conv 3x3/2 fwd":2.0' ] ||
      fail "--profile-ops: expected 17 3x3/1, 2 3x3/2 and 2 1x1/2 convolutions per step each way, got: $calls"
    grep -q '^  all kernels ' profile.out || fail "--profile-ops: no 'all kernels' row"
    ;;
  machine_probe)
    probe=$BUILD/bench/machine_probe
    "$probe" memcpy >memcpy.out || fail "machine_probe memcpy failed"
    sed 's/^/  /' memcpy.out
    [ "$(grep -c '^memcpy [0-9]*[KM]iB *[0-9.]* GB/s$' memcpy.out)" -eq 5 ] || fail "expected 5 memcpy sizes"
    grep -q '^RESULT {"memcpy_gb_per_s":{"4KiB":[0-9.]*,.*"64MiB":[0-9.]*}}$' memcpy.out || fail "no memcpy RESULT line"
    "$probe" gemm --size 128 >gemm.out || fail "machine_probe gemm failed"
    sed 's/^/  /' gemm.out
    grep -q '^RESULT {"gemm_size":128,"gemm_gflop_per_s":[0-9.]*}$' gemm.out || fail "no GEMM RESULT line"
    "$probe" load --mib 8 >load.out &
    load=$!
    for _ in $(seq 600); do grep -q '^load: streaming' load.out && break; sleep 0.05; done
    grep -q '^load: streaming 8 MiB buffers$' load.out || fail "machine_probe load never said it was streaming"
    kill -TERM $load
    wait $load || fail "machine_probe load did not exit 0 at SIGTERM"
    sed 's/^/  /' load.out
    grep -q '^load: [1-9][0-9]* copies of 8 MiB in .* GB/s$' load.out || fail "no load summary line"
    # The CNN: 2 x 3 x (26*26*32*9 + 11*11*64*288 + 1600*64 + 64*10) = 15.17 MFLOP per sample.
    (cd "$SRC" && "$BUILD/bench/train_bench" --config configs/mnist.json --set "data.dir=\"$MNIST_DIR\"" --warmup 1 --steps 2 \
      --reps 1) >bench.out ||
      fail "train_bench failed"
    grep -q '"training_flops_per_sample":15168000[,}]' bench.out || fail "the CNN's FLOPs per sample are not 15168000"
    # --profile-ops counts each kernel's FLOPs: forward 2 x 2,528,000 per sample, backward twice that
    # but for conv1 (389,376), whose input wants no gradient: 5,056,000 + 2 x 4,666,624 + 389,376 =
    # 14,778,624 per sample, 945,831,936 per step of 64.
    (cd "$SRC" && "$BUILD/bench/train_bench" --config configs/mnist.json --set "data.dir=\"$MNIST_DIR\"" --batch 64 --warmup 1 \
      --steps 2 --reps 2 --profile-ops) >profile.out || fail "train_bench --profile-ops failed"
    grep -q '^  all kernels ' profile.out || fail "train_bench --profile-ops: no 'all kernels' row"
    grep -q '"flops_per_step":945831936.0[,}]' profile.out ||
      fail "train_bench --profile-ops: expected 945831936 FLOPs per step, got $(grep -o '"flops_per_step":[0-9.e+]*' profile.out)"
    ;;
  *)
    fail "unknown case '$CASE'"
    ;;
esac
echo "PASS: $CASE"
