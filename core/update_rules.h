// The SGD and Adam update of one element, written once for every backend (the CPU loops and the
// CUDA kernels inline these), following torch.optim (1.13) operation by operation. The per-step
// scalars are computed on the host by optim/ (in double, as Python computes them).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace dptrain {

struct SgdStep {
  float lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  // Multiplies each gradient first: gradient clipping's factor (clip_grad_norm_ scales the gradients
  // in place before the step; here the update reads them once instead of twice).
  float grad_scale = 1;
  bool nesterov = false;
  bool first_step = false;  // PyTorch starts the momentum buffer as a copy of the first gradient
  // In the backend's memory; when set and *skip_if_set != 0 the update does nothing (a gradient
  // check flagged the step on the device, and the host has not looked yet: Backend::mark_non_finite).
  const int32_t* skip_if_set = nullptr;
};

struct AdamStep {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float step_size = 0;                   // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1;       // sqrt(1 - beta2^t)
  float decay = 1;                       // AdamW: 1 - lr * weight_decay; Adam: 1
  float l2 = 0;                          // Adam: weight_decay; AdamW: 0
  float grad_scale = 1;                  // as SgdStep's
  const int32_t* skip_if_set = nullptr;  // as SgdStep's
};

// grad x scale, and grad itself where the scale is 1: the product would be the same, but the compiler may
// fuse it with the weight decay's addition in place of the decay's own product (fma(wd, param, grad),
// as ATen's add with alpha computes it), and round the sum differently.
DPTRAIN_HOST_DEVICE inline float scaled_gradient(float grad, float scale) {
  return scale == 1.0f ? grad : grad * scale;
}

// `momentum_buffer` is untouched when s.momentum is 0 (there is none then).
DPTRAIN_HOST_DEVICE inline void sgd_update(float& param, float grad, float& momentum_buffer,
                                           const SgdStep& s) {
  const float g = scaled_gradient(grad, s.grad_scale);
  if (s.momentum == 0.0f) {
    param += -s.lr * (g + s.weight_decay * param);
    return;
  }
  const float d = g + s.weight_decay * param;
  // On the first step 0 * buffer + 1 * d: the copy of d PyTorch makes (up to the sign of a zero).
  const float keep = s.first_step ? 0.0f : s.momentum, add = s.first_step ? 1.0f : 1.0f - s.dampening;
  const float buf = momentum_buffer * keep + add * d;
  momentum_buffer = buf;
  param += -s.lr * (s.nesterov ? d + s.momentum * buf : buf);
}

DPTRAIN_HOST_DEVICE inline void adam_update(float& param, float grad, float& exp_avg, float& exp_avg_sq,
                                            const AdamStep& s) {
  const float p = param * s.decay;
  const float g = scaled_gradient(grad, s.grad_scale) + s.l2 * p;
  const float m = exp_avg * s.beta1 + (1.0f - s.beta1) * g;
  const float v = exp_avg_sq * s.beta2 + (1.0f - s.beta2) * g * g;
  exp_avg = m;
  exp_avg_sq = v;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  param = p - s.step_size * m / denom;
}

}  // namespace dptrain
