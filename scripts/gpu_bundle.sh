#!/usr/bin/env bash
# Packs what the GPU checks need onto a machine that has CUDA's libraries but not this project's
# dependencies (the lent H100/H200 image: nvcc, PyTorch with NVIDIA's cuBLAS/cuDNN/NCCL wheels, no
# Open MPI, no network): a build for any x86-64 CPU (-DDPTRAIN_NATIVE=OFF) with the CUDA backend,
# the programs, MNIST gzipped, the configs, the scripts, and every shared library they load except
# the C library and CUDA's own (cudart, cuBLAS, cuDNN, NCCL: the machine's), Open MPI's launcher and
# plugins included. The programs find the libraries through their rpath ($ORIGIN/../lib, and
# $ORIGIN/../cuda-lib, where scripts/gpu_check.sh's probe links the machine's NVIDIA libraries):
# no LD_LIBRARY_PATH that would also capture python3 and PyTorch. On the other machine:
#
#   gpu-bundle/scripts/gpu_check.sh all --out /tmp/gpu-check      # everything (README: GPUs)
#   source gpu-bundle/env.sh && bin/trainer --config configs/mnist.json --set device=cuda ...
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
if ! command -v patchelf >/dev/null; then
  echo "== installing patchelf (Debian's), which sets the copied libraries' rpath =="
  { apt-get update -q && apt-get install -y -q patchelf; } >/dev/null ||
    { echo "gpu_bundle.sh: needs patchelf: apt-get install patchelf" >&2; exit 1; }
fi

echo "== building $build (portable x86-64, CUDA backend, no sanitizers) =="
# DT_RPATH rather than RUNPATH: it serves the libraries' own dependencies too (libmpi's libopen-pal).
scripts/build.sh "$build" -DDPTRAIN_NATIVE=OFF -DDPTRAIN_CUDA=ON '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib;$ORIGIN/../cuda-lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -DCMAKE_MODULE_LINKER_FLAGS=-Wl,--disable-new-dtags
programs=("$build/trainer" "$build/bench/train_bench" "$build/bench/synthetic_benchmark"
          "$build/tests/core/backend_conformance" "$build/tests/cuda/cuda_tests" "$build/tests/e2e_check")
# The libraries the CUDA backend's module loads besides CUDA's are collected with the programs'.
loaded=("${programs[@]}" "$build/lib/libdptrain_cuda.so")

rm -rf "$out"
mkdir -p "$out/bin/tests" "$out/lib" "$out/configs" "$out/data/mnist" "$out/openmpi/bin" "$out/tests/trainer" \
  "$out/bench" "$out/scripts"
cp "${programs[@]}" "$out/bin/"
# The programs look for the CUDA backend's module in the build's lib/ first (trainer/CMakeLists.txt):
# that entry goes, so that the bundle's lib/ serves, whatever path the other machine has.
for program in "${programs[@]}"; do
  f="$out/bin/$(basename "$program")"
  chmod u+w "$f"
  rpath=$(patchelf --print-rpath "$f")
  patchelf --force-rpath --set-rpath "$(tr ':' '\n' <<<"$rpath" | grep -vxF "$build/lib" | paste -sd:)" "$f"
done
# The layout the end-to-end scripts expect of a build and a source tree: <bin>/tests/e2e_check,
# <source>/configs, <source>/data/mnist. A link, so that $ORIGIN stays bin/.
ln -s ../e2e_check "$out/bin/tests/e2e_check"
cp tests/e2e_common.sh "$out/tests/"
cp tests/trainer/gpu_e2e.sh "$out/tests/trainer/"
cp bench/gpu_vs_pytorch.sh bench/torch_gpu_bench.py bench/torch_synthetic_bench.py "$out/bench/"
cp scripts/gpu_check.sh "$out/scripts/"
cp configs/*.json "$out/configs/"
for f in data/mnist/*-ubyte; do gzip -9 -c "$f" >"$out/data/mnist/$(basename "$f").gz"; done

# Open MPI's launcher and daemon, its plugins and PMIx's, and its help texts.
ompi_lib=$(dirname "$(readlink -f "$(ldd "$build/trainer" | awk '/libmpi.so/ { print $3 }')")")
cp "$(readlink -f "$(command -v mpirun)")" "$out/openmpi/bin/mpirun"
cp "$(command -v orted)" "$out/openmpi/bin/orted"
cp -r "$ompi_lib/openmpi/lib/openmpi3" "$out/openmpi/plugins"
pmix_plugins=$(ls -d "$ompi_lib"/pmix2/lib/pmix 2>/dev/null || true)
[[ -n "$pmix_plugins" ]] && cp -r "$pmix_plugins" "$out/openmpi/pmix-plugins"
cp -r /usr/share/openmpi "$out/openmpi/share" 2>/dev/null || true

# Every library those load, but the C and C++ runtimes and the base libraries every Linux has (a
# newer copy serves an older program, while an older copy on the library path would break the
# machine's own programs, PyTorch among them), and CUDA's (its wheels' match its driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libz\.so|libuuid|libudev|libcuda\.so|libcudart|libcublas|libcudnn|libnccl)'
{
  for f in "${loaded[@]}" "$out/openmpi/bin/mpirun" "$out/openmpi/bin/orted" "$out"/openmpi/plugins/*.so \
           ${pmix_plugins:+"$out"/openmpi/pmix-plugins/*.so}; do
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\// { print $1, $3 }'
  done
} | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] || cp -L "$path" "$out/lib/$name"
done
# Debian's Open MPI binaries, plugins and libraries carry a RUNPATH of Debian's folders: pointed at
# the bundle's lib/ instead, so that they, and the plugins they open, find its copies.
chmod u+w "$out"/lib/* "$out"/openmpi/bin/* "$out"/openmpi/plugins/*.so
patchelf --set-rpath '$ORIGIN' "$out"/lib/*
patchelf --set-rpath '$ORIGIN/../../lib' "$out"/openmpi/bin/* "$out"/openmpi/plugins/*.so \
  ${pmix_plugins:+"$out"/openmpi/pmix-plugins/*.so}
# The CUDA backend, which the programs open from their rpath's lib/ for a GPU run, keeps the rpath
# it was built with: its own folder and cuda-lib/.
cp "$build/lib/libdptrain_cuda.so" "$out/lib/"

cat >"$out/env.sh" <<'ENV'
# Sourced on the GPU machine (scripts/gpu_check.sh does): the bundle's programs and Open MPI on the
# PATH, Open MPI's plugins and help texts where the bundle put them, settings for one VM. No
# LD_LIBRARY_PATH: every program and library of the bundle carries an rpath to its lib/, and
# python3 and PyTorch keep their own libraries.
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="$bundle/bin:$bundle/openmpi/bin:$PATH"
export OMPI_MCA_mca_base_component_path="$bundle/openmpi/plugins"
export PMIX_MCA_mca_base_component_path="$bundle/openmpi/pmix-plugins"
export OPAL_PKGDATADIR="$bundle/openmpi/share"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One host and no ssh there: mpirun starts local ranks itself, and a rank without mpirun needs no
# helper daemon (Open MPI would otherwise look for ssh, or fail MPI_Init as a singleton).
export OMPI_MCA_plm=isolated OMPI_MCA_ess_singleton_isolated=1
# A VM: shared memory between the ranks without a single-copy mechanism (no CMA or KNEM there), and
# no probing for UCX, InfiniBand or other fabrics.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx OMPI_MCA_coll_hcoll_enable=0
ENV
du -sh "$out" | awk -v out="$out" '{ print "== bundle: " out " (" $1 "); on the GPU machine: " out "/scripts/gpu_check.sh all ==" }'
