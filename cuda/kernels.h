// CUDA kernels for the data-parallel step on a device: the fused SGD and Adam updates (one launch
// over all parameters, which live in one flat buffer), and fp32 <-> fp16/bf16 casts for compressed
// gradient reduction. Numerics follow optim/optimizer.cpp and core/half.h (round to nearest even).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/half.h"

namespace dptrain::cuda {

// Flat device arrays of `size` floats each: every parameter of the model, back to back, with its
// gradient and optimizer state at the same offsets.
struct FlatParameters {
  float* params = nullptr;
  const float* grads = nullptr;
  float* state0 = nullptr;  // SGD: momentum_buffer; Adam: exp_avg
  float* state1 = nullptr;  // Adam: exp_avg_sq
  int64_t size = 0;
};

struct SgdScalars {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  // PyTorch copies the first gradient into the momentum buffer
};
void sgd_step(const FlatParameters& p, const SgdScalars& s, cudaStream_t stream);

struct AdamScalars {
  float beta1, beta2, eps;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float decay;                  // AdamW: 1 - lr * weight_decay; Adam: 1
  float l2;                     // Adam: weight_decay; AdamW: 0
};
// The scalars of step `step` (1-based), computed in double as optim::Adam does.
AdamScalars adam_scalars(float lr, float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                         int64_t step);
void adam_step(const FlatParameters& p, const AdamScalars& s, cudaStream_t stream);

// dst[i] = half(src[i] * scale) and back; `n` elements.
void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format,
                      cudaStream_t stream);
void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format, cudaStream_t stream);

}  // namespace dptrain::cuda
