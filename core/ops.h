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
// x [B, C, H, W] -> [B, C, OH, OW], OH = (H + 2 padding - kernel) / stride + 1; padding takes no
// part in the maximum (padding <= kernel / 2, as PyTorch requires). Ties send the gradient to the
// first maximum in row-major window order, as PyTorch does.
Tensor maxpool2d(const Tensor& x, int kernel, int stride, int padding = 0);
struct MaxPool2dOptions {
  int kernel = 2;
  int stride = 2;
  int padding = 0;
};
// maxpool2d(conv2d(x, weight, bias, conv with fuse_relu), pool...) in one kernel, so that the conv
// output (the largest activation of a small CNN) need not go to memory and back, forward or
// backward. The same numbers as the two ops.
Tensor conv2d_relu_maxpool(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions conv,
                           MaxPool2dOptions pool);
// x [B, C, H, W] -> [B, C]: the mean of each plane (PyTorch's AdaptiveAvgPool2d(1) + flatten).
Tensor global_avgpool(const Tensor& x);

// Sums per-channel statistics over the replicas of a data-parallel job, for SyncBatchNorm. The
// trainer provides one over its communicator; ops and layers see only this.
class CrossReplicaSum {
 public:
  virtual ~CrossReplicaSum() = default;
  // Replaces the n doubles at `values` (memory of `device`) by their sum over every replica. All
  // replicas call it at the same points of forward and backward with the same n.
  virtual void sum(double* values, int64_t n, Device device, const char* what) = 0;
};

struct BatchNormOptions {
  bool training = true;
  float momentum = 0.1f;
  float eps = 1e-5f;
  CrossReplicaSum* sync = nullptr;  // training with it: statistics over every replica's batch
  // The epilogue, in the same pass (a ResNet block's tail): relu(batch_norm(x) + residual), residual
  // (when defined) of x's shape. The numbers are those of batch_norm, add and relu as separate ops,
  // bit for bit, without storing the normalised tensor or the sum, forward or backward.
  Tensor residual{};
  bool relu = false;
};
// x [B, C, ...] normalised per channel (PyTorch's batch_norm): training uses the batch's mean and
// biased variance and moves running_mean / running_var (if defined) towards its mean and unbiased
// variance by `momentum`, in place; evaluation uses the running estimates. weight, bias [C].
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& options);

// a + b, same shapes (residual connections).
Tensor add(const Tensor& a, const Tensor& b);

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
