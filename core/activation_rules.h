// ReLU of one element and its gradient, written once for every backend (CPU loops, the fused convolution
// epilogues, the reference and the CUDA kernels inline it).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace dptrain {

// As torch.relu: NaN passes through, so a diverging run still reaches the finiteness check instead
// of being silently clipped to 0 (fmaxf and `v > 0 ? v : 0` both drop it); -0 becomes +0.
DPTRAIN_HOST_DEVICE inline float relu_of(float v) {
  return v <= 0.0f ? 0.0f : v;
}

// ReLU's derivative at v (its input, or its output): 1.0f where v > 0, else 0.0f, made from the
// comparison's mask rather than by `v > 0 ? 1.0f : 0.0f`. GCC (under -ftrapping-math) would not
// if-convert a multiply by the latter without AVX-512's masks: on AVX2 every loop over it became a
// branch per element, half of them mispredicted on ReLU's data.
DPTRAIN_HOST_DEVICE inline float relu_derivative(float v) {
  return __builtin_bit_cast(float, -static_cast<uint32_t>(v > 0.0f) & 0x3f800000u);
}

// The gradient behind ReLU's output y, as ReLU's backward adds it to a zeroed buffer: y > 0 exactly
// where the input was, and 0 + gy * 0 keeps Inf upstream of an inactive unit visible as NaN.
DPTRAIN_HOST_DEVICE inline float relu_gradient(float gy, float y) {
  return 0.0f + gy * relu_derivative(y);
}

}  // namespace dptrain
