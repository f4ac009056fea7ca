#!/usr/bin/env bash
# Packs what the GPU checks need onto a machine that has CUDA's libraries but not this project's
# dependencies (the lent H100/H200 image: nvcc, PyTorch with NVIDIA's cuBLAS/cuDNN/NCCL wheels, no
# Open MPI, no network): a build for any x86-64 CPU (-DDPTRAIN_NATIVE=OFF) with the CUDA backend,
# the programs, MNIST gzipped, the configs, and every shared library they load except the C
# library and CUDA's own (cudart, cuBLAS, cuDNN, NCCL: the machine's), Open MPI's launcher and
# plugins included. On the other machine:
#
#   cd gpu-bundle && source env.sh    # PATH, LD_LIBRARY_PATH (the bundle's and the NVIDIA wheels'), Open MPI
#   bin/trainer --config configs/mnist.json --set device=cuda --set data.dir=data/mnist
#   bash tests/trainer/gpu_e2e.sh gpu_two_ranks $PWD/bin/trainer $PWD /tmp/e2e mpirun
#   bench/gpu_vs_pytorch.sh --bin bin --data data/mnist
#
#   scripts/gpu_bundle.sh [--build DIR] [--out DIR]     (defaults: build-gpu, gpu-bundle)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo_root/build-gpu" out="$repo_root/gpu-bundle"
while (($#)); do
  case "$1" in
    --build) build="$(realpath -m "$2")"; shift 2 ;;
    --out) out="$(realpath -m "$2")"; shift 2 ;;
    *) echo "gpu_bundle.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
cd "$repo_root"

echo "== building $build (portable x86-64, CUDA backend, no sanitizers) =="
scripts/build.sh "$build" -DDPTRAIN_NATIVE=OFF -DDPTRAIN_CUDA=ON
programs=("$build/trainer" "$build/bench/train_bench" "$build/tests/core/backend_conformance"
          "$build/tests/cuda/cuda_tests")

rm -rf "$out"
mkdir -p "$out/bin/tests" "$out/lib" "$out/configs" "$out/data/mnist" "$out/openmpi" "$out/tests/trainer" "$out/bench"
cp "${programs[@]}" "$out/bin/"
programs+=("$build/tests/e2e_check")
# The layout the end-to-end scripts expect of a build and a source tree: <bin>/tests/e2e_check,
# <source>/configs, <source>/data/mnist.
cp "$build/tests/e2e_check" "$out/bin/tests/"
cp tests/e2e_common.sh "$out/tests/"
cp tests/trainer/gpu_e2e.sh "$out/tests/trainer/"
cp bench/gpu_vs_pytorch.sh bench/torch_gpu_bench.py "$out/bench/"
cp configs/*.json "$out/configs/"
for f in data/mnist/*-ubyte; do gzip -9 -c "$f" >"$out/data/mnist/$(basename "$f").gz"; done

# Open MPI's launcher and daemon, its plugins and PMIx's, and its help texts.
ompi_lib=$(dirname "$(readlink -f "$(ldd "$build/trainer" | awk '/libmpi.so/ { print $3 }')")")
cp "$(readlink -f "$(command -v mpirun)")" "$out/openmpi/mpirun"
cp "$(command -v orted)" "$out/openmpi/orted"
cp -r "$ompi_lib/openmpi/lib/openmpi3" "$out/openmpi/plugins"
pmix_plugins=$(ls -d "$ompi_lib"/pmix2/lib/pmix 2>/dev/null || true)
[[ -n "$pmix_plugins" ]] && cp -r "$pmix_plugins" "$out/openmpi/pmix-plugins"
cp -r /usr/share/openmpi "$out/openmpi/share" 2>/dev/null || true

# Every library those load, but the C and C++ runtimes and the base libraries every Linux has (a
# newer copy serves an older program, while an older copy on the library path would break the
# machine's own programs, PyTorch among them), and CUDA's (its wheels' match its driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libz\.so|libuuid|libudev|libcuda\.so|libcudart|libcublas|libcudnn|libnccl)'
{
  for f in "${programs[@]}" "$out/openmpi/mpirun" "$out/openmpi/orted" "$out"/openmpi/plugins/*.so \
           ${pmix_plugins:+"$out"/openmpi/pmix-plugins/*.so}; do
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\// { print $1, $3 }'
  done
} | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] || cp -L "$path" "$out/lib/$name"
done

cat >"$out/env.sh" <<'ENV'
# Sourced on the GPU machine: the bundle's programs and libraries, the NVIDIA libraries of the
# machine's PyTorch wheels (cuDNN, NCCL, cuBLAS, the runtime), and Open MPI where the bundle put it.
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvidia_libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "**", "lib"), recursive=True)})))
PY
)
export PATH="$bundle/bin:$bundle/openmpi:$PATH"
export LD_LIBRARY_PATH="$bundle/lib${nvidia_libs:+:$nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_MCA_mca_base_component_path="$bundle/openmpi/plugins"
export PMIX_MCA_mca_base_component_path="$bundle/openmpi/pmix-plugins"
export OPAL_PKGDATADIR="$bundle/openmpi/share"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One host and no ssh there: mpirun starts local ranks itself, and a rank without mpirun needs no
# helper daemon (Open MPI would otherwise look for ssh, or fail MPI_Init as a singleton).
export OMPI_MCA_plm=isolated OMPI_MCA_ess_singleton_isolated=1
ENV
du -sh "$out" | awk -v out="$out" '{ print "== bundle: " out " (" $1 "); on the GPU machine: source " out "/env.sh ==" }'
