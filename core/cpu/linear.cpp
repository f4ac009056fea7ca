// matmul, linear and add_bias on the CPU: Eigen GEMMs over the tensors' buffers.
#include "core/autograd.h"
#include "core/cpu/eigen.h"
#include "core/error.h"
#include "core/ops.h"

namespace dptrain::ops {

Tensor matmul(const Tensor& a, const Tensor& b) {
  DPTRAIN_CHECK(a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == b.dim(0), "matmul: shapes ", shape_str(a.shape()),
                " and ", shape_str(b.shape()), " do not chain");
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  Tensor out = Tensor::empty({m, n});
  cpu::mat(out.data(), m, n).noalias() = cpu::mat(a.data(), m, k) * cpu::mat(b.data(), k, n);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(out, {&a, &b}, [a, b, out, m, k, n] {
      auto gy = cpu::mat(out.grad_data(), m, n);
      if (a.requires_grad()) cpu::mat(a.grad_data(), m, k).noalias() += gy * cpu::mat(b.data(), k, n).transpose();
      if (b.requires_grad()) cpu::mat(b.grad_data(), k, n).noalias() += cpu::mat(a.data(), m, k).transpose() * gy;
    });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DPTRAIN_CHECK(x.ndim() == 2 && weight.ndim() == 2 && x.dim(1) == weight.dim(1), "linear: input ",
                shape_str(x.shape()), " does not match weight ", shape_str(weight.shape()), " ([out, in])");
  const int64_t batch = x.dim(0), in = x.dim(1), out_features = weight.dim(0);
  DPTRAIN_CHECK(!bias.defined() || (bias.ndim() == 1 && bias.dim(0) == out_features), "linear: bias ",
                shape_str(bias.shape()), " does not match ", out_features, " outputs");
  Tensor out = Tensor::empty({batch, out_features});
  auto y = cpu::mat(out.data(), batch, out_features);
  y.noalias() = cpu::mat(x.data(), batch, in) * cpu::mat(weight.data(), out_features, in).transpose();
  if (bias.defined()) y.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias.data(), out_features);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(out, {&x, &weight, &bias}, [x, weight, bias, out, batch, in, out_features] {
      auto gy = cpu::mat(out.grad_data(), batch, out_features);
      if (x.requires_grad())
        cpu::mat(x.grad_data(), batch, in).noalias() += gy * cpu::mat(weight.data(), out_features, in);
      if (weight.requires_grad())
        cpu::mat(weight.grad_data(), out_features, in).noalias() += gy.transpose() * cpu::mat(x.data(), batch, in);
      if (bias.defined() && bias.requires_grad())
        Eigen::Map<Eigen::RowVectorXf>(bias.grad_data(), out_features) += gy.colwise().sum();
    });
  }
  return out;
}

Tensor add_bias(const Tensor& x, const Tensor& bias) {
  DPTRAIN_CHECK(x.ndim() >= 2 && bias.ndim() == 1 && bias.dim(0) == x.dim(1), "add_bias: bias ",
                shape_str(bias.shape()), " does not match dimension 1 of ", shape_str(x.shape()));
  const int64_t outer = x.dim(0), channels = x.dim(1), inner = x.numel() / (outer * channels);
  Tensor out = Tensor::empty(x.shape());
  const float* xs = x.data();
  const float* bs = bias.data();
  float* ys = out.data();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t at = (o * channels + c) * inner + i;
        ys[at] = xs[at] + bs[c];
      }
  if (autograd::any_requires_grad({&x, &bias})) {
    autograd::record(out, {&x, &bias}, [x, bias, out, outer, channels, inner] {
      const float* gy = out.grad_data();
      if (x.requires_grad()) {
        float* gx = x.grad_data();
        for (int64_t i = 0; i < x.numel(); ++i) gx[i] += gy[i];
      }
      if (bias.requires_grad()) {
        float* gb = bias.grad_data();
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t c = 0; c < channels; ++c) {
            float acc = 0;
            for (int64_t i = 0; i < inner; ++i) acc += gy[(o * channels + c) * inner + i];
            gb[c] += acc;
          }
      }
    });
  }
  return out;
}

}  // namespace dptrain::ops
