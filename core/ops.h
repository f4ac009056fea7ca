// Differentiable tensor operations, device-neutral: each checks its inputs (same device, fitting
// shapes), allocates its output on their device, runs that device's backend kernel (core/backend.h)
// and records its backward on the tape when an input requires grad.
#pragma once

#include <cstdint>
#include <span>

#include "core/backend.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace dptrain::ops {

// a [M, K] x b [K, N] -> [M, N]
Tensor matmul(const Tensor& a, const Tensor& b);
// x [B, in] x weight [out, in]^T (+ bias [out]) -> [B, out]; bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// x [B, C, ...] + bias [C] broadcast over every other dimension.
Tensor add_bias(const Tensor& x, const Tensor& bias);

struct Conv2dOptions {
  int stride = 1;
  int padding = 0;
  // Applies ReLU to the output inside the kernel: relu(conv2d(...)) without a separate pass over the
  // activation (the largest tensor of a small CNN) forward and backward.
  bool fuse_relu = false;
};
// x [B, C, H, W], weight [O, C, KH, KW], bias [O] (may be undefined) -> [B, O, OH, OW]
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions options = {});
// x [B, C, H, W] -> [B, C, OH, OW]; no padding; ties send the gradient to the first maximum
// in row-major window order, as PyTorch does.
Tensor maxpool2d(const Tensor& x, int kernel, int stride);

Tensor activation(const Tensor& x, Activation f);
inline Tensor relu(const Tensor& x) {
  return activation(x, Activation::kRelu);
}
inline Tensor tanh(const Tensor& x) {
  return activation(x, Activation::kTanh);
}
inline Tensor sigmoid(const Tensor& x) {
  return activation(x, Activation::kSigmoid);
}

Tensor reshape(const Tensor& x, Shape shape);
// [B, ...] -> [B, prod(...)]
Tensor flatten(const Tensor& x);
// Inverted dropout: zeroes each element with probability p and scales survivors by 1/(1-p); draws
// one number from `rng` per element (the same mask on every device).
Tensor dropout(const Tensor& x, float p, Rng& rng);

// Mean over the batch of -log softmax(logits)[label]; logits [B, C], labels (host memory) in [0, C).
Tensor cross_entropy(const Tensor& logits, std::span<const int32_t> labels);
// Mean over all elements of (prediction - target)^2; target needs no gradient.
Tensor mse(const Tensor& prediction, const Tensor& target);

// Sum of all elements (a scalar); handy for tests and custom losses.
Tensor sum(const Tensor& x);

}  // namespace dptrain::ops
