#!/usr/bin/env bash
# Horovod's synthetic benchmark, ours against torchvision's model on PyTorch, one thread each, in
# one run: resnet18 on 3x64x64 at batch 32 and resnet50 on 3x224x224 at batch 16, SGD with momentum. Runs are
# interleaved (ours, torch, torch tuned, ours, ...) so that drift on a noisy machine hits all; the
# ratio is of the medians, against the faster of PyTorch's two. "torch tuned" runs with the malloc
# settings of ../shared/anchors (freed memory kept instead of returned to the OS, as our storage cache
# keeps it): on some VMs glibc's default returns PyTorch's activations after every step and faults
# them back in (2026-11-30, Zen 5: resnet18 33.5 img/s as shipped, 133.8 tuned; 374k page faults
# against 97k).
#
#   bench/synthetic_vs_pytorch.sh [build-dir] [rounds] [avx2]   (defaults: build, 3; 10-20 minutes)
#
# avx2: both sides at AVX2 on a machine with AVX-512, a stand-in for a core without it (Zen 3):
# PyTorch's oneDNN and ATen kernels capped at AVX2 (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY), and a
# build whose kernels are AVX2, which the script checks (cmake -B build-avx2 -DDPTRAIN_NATIVE=OFF
# -DCMAKE_CXX_FLAGS=-march=haswell). Not a measurement of that core: its caches and ports differ.
#
# Needs /usr/bin/python3 with torch and torchvision (scripts/setup.sh --with-torch).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/tuned_malloc.sh
source "$repo_root/bench/tuned_malloc.sh"
build="${1:-$repo_root/build}"
rounds="${2:-3}"
isa="${3:-native}"
bench="$build/bench/synthetic_benchmark"
[[ -x "$bench" ]] || { echo "synthetic_vs_pytorch: $bench not built (cmake --build $build --target synthetic_benchmark)" >&2; exit 1; }
torch_isa=()
case "$isa" in
  native) ;;
  avx2)
    torch_isa=(ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2)
    built_for=$("$bench" --model resnet18 --input-shape 3,32,32 --batch-size 2 --threads 1 \
      --num-warmup-batches 0 --num-batches-per-iter 1 --num-iters 1 | sed -n 's/^CPU kernels built for: \([^ ]*\).*/\1/p')
    [[ $built_for == AVX2 ]] || {
      echo "synthetic_vs_pytorch: avx2 needs a build whose kernels are AVX2; $build's are ${built_for:-unknown}" \
        "(cmake -B build-avx2 -DDPTRAIN_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=haswell)" >&2
      exit 1
    } ;;
  *) echo "synthetic_vs_pytorch: the third argument is avx2 or nothing, not '$isa'" >&2; exit 2 ;;
esac
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null || {
  echo "synthetic_vs_pytorch: needs /usr/bin/python3 with torch and torchvision (scripts/setup.sh --with-torch)" >&2; exit 1; }

median() { /usr/bin/python3 -c 'import statistics,sys; print(statistics.median(float(v) for v in sys.argv[1:]))' "$@"; }
result() { sed -n 's/^RESULT //p' | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["img_per_sec_median"])'; }

[[ $isa == native ]] || echo "both at AVX2: our kernels built for it, PyTorch's capped (${torch_isa[*]})"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPU(s) for this process"
printf '%-9s %-10s %6s %14s %14s %14s %7s\n' model input batch "ours img/s" "torch img/s" "torch tuned" ratio
# resnet50 is short (1 warm-up, 2 x 2 timed batches): a PyTorch step takes about 35 s on one thread here.
for case in "resnet18 3,64,64 32 2 5 5" "resnet50 3,224,224 16 1 2 2"; do
  read -r model shape batch warmup iters per_iter <<<"$case"
  flags=(--model "$model" --input-shape "$shape" --batch-size "$batch" --num-classes 1000 --threads 1
         --num-warmup-batches "$warmup" --num-batches-per-iter "$per_iter" --num-iters "$iters")
  ours=() torch=() tuned=()
  for ((round = 0; round < rounds; ++round)); do
    ours+=("$("$bench" "${flags[@]}" | result)")
    torch+=("$(env "${torch_isa[@]}" /usr/bin/python3 "$repo_root/bench/torch_synthetic_bench.py" "${flags[@]}" |
      result)")
    tuned+=("$(env "${torch_isa[@]}" "${TUNED_MALLOC[@]}" /usr/bin/python3 "$repo_root/bench/torch_synthetic_bench.py" \
      "${flags[@]}" | result)")
  done
  o=$(median "${ours[@]}") t=$(median "${torch[@]}") u=$(median "${tuned[@]}")
  /usr/bin/python3 -c "print(f'{\"$model\":<9} {\"$shape\":<10} {$batch:6d} {$o:14.1f} {$t:14.1f} {$u:14.1f} {$o/max($t, $u):6.2f}x')"
done
