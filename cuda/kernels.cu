// Fused optimizer updates and half-precision casts; grid-stride loops, one launch per call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "cuda/check.h"
#include "cuda/kernels.h"

namespace dptrain::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  // Enough blocks to fill an H100 several times over; the grid-stride loop covers the rest.
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 132 * 32));
}

__device__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t grid_stride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

__global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                           float* __restrict__ momentum_buffer, int64_t n, SgdStep s) {
  float unused = 0.0f;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    sgd_update(params[i], grads[i], momentum_buffer ? momentum_buffer[i] : unused, s);
}

__global__ void adam_kernel(float* __restrict__ params, const float* __restrict__ grads,
                            float* __restrict__ m, float* __restrict__ v, int64_t n, AdamStep s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) adam_update(params[i], grads[i], m[i], v[i], s);
}

__global__ void to_fp16_kernel(const float* __restrict__ src, __half* __restrict__ dst, int64_t n,
                               float scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = __float2half_rn(src[i] * scale);
}
__global__ void to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int64_t n,
                               float scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = __float2bfloat16_rn(src[i] * scale);
}
__global__ void from_fp16_kernel(const __half* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = __half2float(src[i]);
}
__global__ void from_bf16_kernel(const __nv_bfloat16* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = __bfloat162float(src[i]);
}

}  // namespace

void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n, const SgdStep& s,
              cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(params, grads, momentum_buffer, n, s);
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamStep& s, cudaStream_t stream) {
  if (n == 0) return;
  adam_kernel<<<blocks_for(n), kThreads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, n, s);
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format,
                      cudaStream_t stream) {
  if (n == 0) return;
  if (format == HalfFormat::kFp16) {
    to_fp16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, reinterpret_cast<__half*>(dst), n, scale);
  } else {
    to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, reinterpret_cast<__nv_bfloat16*>(dst), n,
                                                           scale);
  }
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format, cudaStream_t stream) {
  if (n == 0) return;
  if (format == HalfFormat::kFp16) {
    from_fp16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(reinterpret_cast<const __half*>(src), dst, n);
  } else {
    from_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(src), dst,
                                                             n);
  }
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace dptrain::cuda
