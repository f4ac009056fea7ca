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
                           float* __restrict__ buf, int64_t n, SgdScalars s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float d = grads[i] + s.weight_decay * params[i];
    if (s.momentum == 0.0f) {
      params[i] += -s.lr * d;
      continue;
    }
    const float b = s.first_step ? d : buf[i] * s.momentum + (1.0f - s.dampening) * d;
    buf[i] = b;
    params[i] += -s.lr * (s.nesterov ? d + s.momentum * b : b);
  }
}

__global__ void adam_kernel(float* __restrict__ params, const float* __restrict__ grads,
                            float* __restrict__ m, float* __restrict__ v, int64_t n, AdamScalars s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float p = params[i] * s.decay;
    const float g = grads[i] + s.l2 * p;
    const float mi = m[i] * s.beta1 + (1.0f - s.beta1) * g;
    const float vi = v[i] * s.beta2 + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = p - s.step_size * mi / (sqrtf(vi) / s.bias_correction2_sqrt + s.eps);
  }
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

void sgd_step(const FlatParameters& p, const SgdScalars& s, cudaStream_t stream) {
  if (p.size == 0) return;
  sgd_kernel<<<blocks_for(p.size), kThreads, 0, stream>>>(p.params, p.grads, p.state0, p.size, s);
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

AdamScalars adam_scalars(float lr, float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                         int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  AdamScalars s;
  s.beta1 = beta1;
  s.beta2 = beta2;
  s.eps = eps;
  s.step_size = static_cast<float>(lr / bias_correction1);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.decay = decoupled ? static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay) : 1.0f;
  s.l2 = decoupled ? 0.0f : weight_decay;
  return s;
}

void adam_step(const FlatParameters& p, const AdamScalars& s, cudaStream_t stream) {
  if (p.size == 0) return;
  adam_kernel<<<blocks_for(p.size), kThreads, 0, stream>>>(p.params, p.grads, p.state0, p.state1, p.size, s);
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
