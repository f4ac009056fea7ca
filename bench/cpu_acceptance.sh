#!/usr/bin/env bash
# The CPU figures that ResNet speed is judged by, in one run on whichever machine kind this is, each
# with the machine named: the machine (lscpu model, vector flags, L2), a large GEMM's FLOP/s
# (machine_probe gemm, before and after), ours against torchvision on one thread
# (synthetic_vs_pytorch.sh: resnet18 3x64x64 b32, resnet50 3x224x224 b16), ResNet-50's kernels as a
# share of that GEMM (--profile-ops, 2 steps, with Winograd's 3x3 layers and without), and resnet18
# at np 2 against two independent runs (synthetic_scaling.sh, 5 pairs). A summary closes it. Benchmark
# an idle machine only: a build or a test beside it takes the np 2 figure from 0.98 to 0.65.
#
#   bench/cpu_acceptance.sh [build-dir] [rounds]      (defaults: build, 3; about 15 minutes)
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo_root/build}"
rounds="${2:-3}"
for program in synthetic_benchmark machine_probe; do
  [[ -x "$build/bench/$program" ]] || {
    echo "cpu_acceptance: $build/bench/$program not built (cmake --build $build)" >&2
    exit 1
  }
done
json() { /usr/bin/python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print($1)"; }
gemm() { taskset -c 0 "$build/bench/machine_probe" gemm | sed -n 's/^RESULT //p' | json '"%.1f" % d["gemm_gflop_per_s"]'; }

model=$(lscpu | sed -n 's/^Model name: *//p')
flags=$(grep -m1 -o -w -E 'avx512f|avx512_bf16|amx_tile|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "machine: $model; $(nproc) cores; flags: $flags; L2 per core $(($(getconf LEVEL2_CACHE_SIZE) / 1024)) KiB"
echo "commit: $(git -C "$repo_root" describe --always --dirty 2>/dev/null || echo unknown); $(date -u +%FT%TZ)"

gemm_before=$(gemm)
echo "machine_probe gemm: $gemm_before GFLOP/s"
echo "== ours against torchvision, one thread ($rounds interleaved rounds)"
versus=$(bash "$repo_root/bench/synthetic_vs_pytorch.sh" "$build" "$rounds")
echo "$versus"
# The profile counts a convolution's FLOPs in the direct form; Winograd's 3x3 layers make 2.25x fewer
# products than that, so the kernels are also timed with it off, whose rate counts what is made.
kernel_profile() {
  taskset -c 0 "$build/bench/synthetic_benchmark" --model resnet50 --batch-size 16 --threads 1 \
    --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 1 --profile-ops --gemm-gflops "$gemm_before" "$@"
}
kernel_rate() {
  sed -n 's/^RESULT //p' |
    json '"%.1f %.0f" % (d["profile"]["flops_per_step"] / d["profile"]["kernel_ms_per_step"] / 1e6, d["profile"]["kernel_ms_per_step"])'
}
echo "== ResNet-50's kernels, 2 steps"
profile=$(kernel_profile)
grep -E '^  (all kernels|conv|batchnorm)' <<<"$profile" | head -12
read -r kernel_gflops kernel_ms <<<"$(kernel_rate <<<"$profile")"
kernels_isa=$(sed -n 's/^CPU kernels built for: //p' <<<"$profile")
echo "== the same with cpu.winograd=false"
direct_profile=$(kernel_profile --set cpu.winograd=false)
grep -E '^  conv 3x3/1' <<<"$direct_profile"
read -r direct_gflops direct_ms <<<"$(kernel_rate <<<"$direct_profile")"
gemm_after=$(gemm)
echo "machine_probe gemm after: $gemm_after GFLOP/s"
echo "== resnet18 at np 2 against two independent runs"
scaling=$(bash "$repo_root/bench/synthetic_scaling.sh" --build "$build" --pairs 5)
echo "$scaling"

ratio() { awk -v m="$1" '$1 == m { print $NF }' <<<"$versus"; }
np2=$(grep -o 'median of 5 pairs: [0-9.]*' <<<"$scaling" | awk '{print $NF}')
share_of() { awk -v k="$1" -v a="$gemm_before" -v b="$gemm_after" 'BEGIN { printf "%.0f", 100 * k / ((a + b) / 2) }'; }
share=$(share_of "$kernel_gflops")
direct_share=$(share_of "$direct_gflops")
echo "== summary ($model; our kernels built for $kernels_isa)"
echo "resnet18 3x64x64 b32 against torchvision (the faster of as shipped and tuned): $(ratio resnet18)  (goal >= 1.3x)"
echo "resnet50 3x224x224 b16 against torchvision:                                   $(ratio resnet50)  (goal >= 1.3x)"
echo "resnet50 kernels: $kernel_ms ms a step, $kernel_gflops GFLOP/s, ${share}% of the large GEMM's $gemm_before-$gemm_after (goal >= 60%)"
echo "  (FLOPs of the direct form; with cpu.winograd=false, every product made: $direct_ms ms, $direct_gflops GFLOP/s, ${direct_share}%)"
echo "resnet18 np 2 against two independent runs, median of 5 pairs: $np2  (goal >= 0.95)"
