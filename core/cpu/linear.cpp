// matmul, linear and add_bias on the CPU: Eigen GEMMs over the tensors' buffers.
#include "core/cpu/eigen.h"
#include "core/cpu/kernels.h"

namespace dptrain::cpu {

void matmul(const float* a, const float* b, float* y, MatmulShape s) {
  mat(y, s.m, s.n).noalias() = mat(a, s.m, s.k) * mat(b, s.k, s.n);
}

void matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb, MatmulShape s) {
  const auto g = mat(gy, s.m, s.n);
  if (ga) mat(ga, s.m, s.k).noalias() += g * mat(b, s.k, s.n).transpose();
  if (gb) mat(gb, s.k, s.n).noalias() += mat(a, s.m, s.k).transpose() * g;
}

void linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) {
  auto out = mat(y, s.batch, s.out);
  out.noalias() = mat(x, s.batch, s.in) * mat(w, s.out, s.in).transpose();
  if (bias) out.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias, s.out);
}

void linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw, float* gbias,
                     LinearShape s) {
  const auto g = mat(gy, s.batch, s.out);
  if (gx) mat(gx, s.batch, s.in).noalias() += g * mat(w, s.out, s.in);
  if (gw) mat(gw, s.out, s.in).noalias() += g.transpose() * mat(x, s.batch, s.in);
  if (gbias) Eigen::Map<Eigen::RowVectorXf>(gbias, s.out) += g.colwise().sum();
}

void add_bias(const float* x, const float* bias, float* y, BiasShape s) {
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t c = 0; c < s.channels; ++c)
      for (int64_t i = 0; i < s.inner; ++i) {
        const int64_t at = (o * s.channels + c) * s.inner + i;
        y[at] = x[at] + bias[c];
      }
}

void add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) {
  if (gx) add(gy, gx, s.outer * s.channels * s.inner);
  if (gbias) {
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t c = 0; c < s.channels; ++c) {
        float acc = 0;
        for (int64_t i = 0; i < s.inner; ++i) acc += gy[(o * s.channels + c) * s.inner + i];
        gbias[c] += acc;
      }
  }
}

}  // namespace dptrain::cpu
