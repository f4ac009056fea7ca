// CUDA kernels for the data-parallel step on a device: the fused SGD and Adam updates (one launch
// over all parameters, which live in one flat buffer), and fp32 <-> fp16/bf16 casts for compressed
// gradient reduction. Numerics follow core/update_rules.h and core/half.h (round to nearest even).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/half.h"
#include "core/update_rules.h"

namespace dptrain::cuda {

// One fused update over flat device buffers of `n` floats (parameters, gradients, optimizer state
// at the same offsets), with the formulas of core/update_rules.h that the CPU backend uses too.
void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n, const SgdStep& s,
              cudaStream_t stream);
void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamStep& s, cudaStream_t stream);

// dst[i] = half(src[i] * scale) and back; `n` elements.
void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format,
                      cudaStream_t stream);
void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format, cudaStream_t stream);

}  // namespace dptrain::cuda
