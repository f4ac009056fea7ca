// Batch normalisation and global average pooling on the CPU. Per-channel sums accumulate in double
// (a float running sum over 400k elements of a ResNet-50 stem channel loses about 5 digits) and
// stay double until the statistics are formed; the elementwise passes run over (sample, channel)
// planes, contiguous and vectorised. The epilogue (+ residual, ReLU) and its backward are compiled in
// per variant, so that the plain normalisation's loops stay as they were.
#include <cmath>
#include <vector>

#include "core/activation_rules.h"
#include "core/cpu/kernels.h"

namespace dptrain::cpu {
namespace {

// Calls f(c) for every channel. Threads split the channels: each channel's sum has one owner, so
// results do not depend on the thread count.
template <typename F>
void for_each_channel(BatchNormShape s, F f) {
#pragma omp parallel for schedule(static) if (s.batch * s.channels * s.inner > 65536)
  for (int64_t c = 0; c < s.channels; ++c) f(c);
}

// Calls f(c, first element) for every [inner] plane of the batch.
template <typename F>
void for_each_plane(BatchNormShape s, F f) {
#pragma omp parallel for schedule(static) if (s.batch * s.channels * s.inner > 65536)
  for (int64_t p = 0; p < s.batch * s.channels; ++p) f(p % s.channels, p * s.inner);
}

}  // namespace

void batchnorm_sums(const float* x, double* sums, BatchNormShape s) {
  for_each_channel(s, [&](int64_t c) {
    double total = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      const float* plane = x + (b * s.channels + c) * s.inner;
      float partial = 0;  // a plane (at most 112 x 112 here) in float, vectorised; planes in double
#pragma omp simd reduction(+ : partial)
      for (int64_t i = 0; i < s.inner; ++i) partial += plane[i];
      total += partial;
    }
    sums[c] = total;
  });
  sums[s.channels] = static_cast<double>(s.batch * s.inner);
}

void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) {
  for_each_channel(s, [&](int64_t c) {
    const auto mean = static_cast<float>(sums[c] / sums[s.channels]);  // the mean normalisation uses
    double total = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      const float* plane = x + (b * s.channels + c) * s.inner;
      float partial = 0;
#pragma omp simd reduction(+ : partial)
      for (int64_t i = 0; i < s.inner; ++i) partial += (plane[i] - mean) * (plane[i] - mean);
      total += partial;
    }
    squares[c] = total;
  });
}

void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                           float* running_var, int64_t channels, float eps, float momentum) {
  const double count = sums[channels];
  for (int64_t c = 0; c < channels; ++c) {
    const double mean = sums[c] / count, var = squares[c] / count;
    stats[c] = static_cast<float>(mean);
    stats[channels + c] = static_cast<float>(1.0 / std::sqrt(var + eps));
    if (running_mean) {
      const double unbiased = count > 1 ? squares[c] / (count - 1) : var;
      running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                             int64_t channels, float eps) {
  for (int64_t c = 0; c < channels; ++c) {
    stats[c] = running_mean[c];
    stats[channels + c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps));
  }
}

namespace {

template <bool kResidual, bool kRelu>
void normalize(const float* x, const float* stats, const float* gamma, const float* beta,
               const float* residual, float* y, BatchNormShape s) {
  for_each_plane(s, [&](int64_t c, int64_t at) {
    // y = x * scale + shift: one multiply-add per element.
    const float scale = stats[s.channels + c] * gamma[c], shift = beta[c] - stats[c] * scale;
#pragma omp simd
    for (int64_t i = 0; i < s.inner; ++i) {
      float v = x[at + i] * scale + shift;
      if constexpr (kResidual) v += residual[at + i];
      y[at + i] = kRelu ? relu_of(v) : v;
    }
  });
}

// One plane's sums of g and g * (x - mean). Every variant of the reduction runs this one loop, out of
// line: a loop body that also masked or stored would be vectorised with other partial sums, and the
// fused kernels would no longer match the separate ones bit for bit.
[[gnu::noinline]] void plane_gradient_sums(const float* g, const float* x, float mean, int64_t n,
                                           float& sum_g, float& sum_g_xmu) {
  float partial_g = 0, partial_g_xmu = 0;
#pragma omp simd reduction(+ : partial_g, partial_g_xmu)
  for (int64_t i = 0; i < n; ++i) {
    partial_g += g[i];
    partial_g_xmu += g[i] * (x[i] - mean);
  }
  sum_g = partial_g;
  sum_g_xmu = partial_g_xmu;
}

template <bool kRelu, bool kResidual>
void backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                     double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                     BatchNormShape s) {
  const bool add = !gresidual.overwrite;
  for_each_channel(s, [&](int64_t c) {
    // The plane's gradient through the ReLU, while it is in L1 (a ResNet plane is at most 49 kB).
    thread_local std::vector<float> masked;
    if (kRelu) masked.resize(static_cast<std::size_t>(s.inner));
    const float mean = stats[c];
    double sum_gy = 0, sum_gy_xmu = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t at = (b * s.channels + c) * s.inner;
      const float* g = gy + at;
      if constexpr (kRelu) {
#pragma omp simd
        for (int64_t i = 0; i < s.inner; ++i) masked[i] = relu_gradient(gy[at + i], relu_y[at + i]);
        g = masked.data();
      }
      if constexpr (kResidual) {
#pragma omp simd
        for (int64_t i = 0; i < s.inner; ++i)
          gresidual.data[at + i] = (add ? gresidual.data[at + i] : 0.0f) + g[i];
      }
      float partial_gy, partial_gy_xmu;
      plane_gradient_sums(g, x + at, mean, s.inner, partial_gy, partial_gy_xmu);
      sum_gy += partial_gy;
      sum_gy_xmu += partial_gy_xmu;
    }
    grad_sums[c] = sum_gy;
    grad_sums[s.channels + c] = sum_gy_xmu;
    if (ggamma) ggamma[c] += static_cast<float>(sum_gy_xmu * stats[s.channels + c]);
    if (gbeta) gbeta[c] += static_cast<float>(sum_gy);
  });
}

template <bool kRelu>
void backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                    const float* gamma, const double* grad_sums, const double* sums, GradientOut gradient,
                    BatchNormShape s) {
  const auto g = [&](int64_t i) { return kRelu ? relu_gradient(gy[i], relu_y[i]) : gy[i]; };
  // 0 + v where the gradient is written: the bits of adding into zeros.
  float* gx = gradient.data;
  const bool add = !gradient.overwrite;
  for_each_plane(s, [&](int64_t c, int64_t at) {
    const float mean = stats[c], invstd = stats[s.channels + c], scale = gamma[c] * invstd;
    if (grad_sums == nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < s.inner; ++i) gx[at + i] = (add ? gx[at + i] : 0.0f) + scale * g(at + i);
      return;
    }
    // gx = scale * (g - mean_g - (x - mean) * invstd^2 * mean_g_xmu), written as g * scale +
    // x * slope + offset so the loop is two multiply-adds.
    const double count = sums[s.channels];
    const auto mean_gy = static_cast<float>(grad_sums[c] / count);
    const auto mean_gy_xmu = static_cast<float>(grad_sums[s.channels + c] / count);
    const float slope = -scale * invstd * invstd * mean_gy_xmu;
    const float offset = -scale * mean_gy - slope * mean;
#pragma omp simd
    for (int64_t i = 0; i < s.inner; ++i)
      gx[at + i] = (add ? gx[at + i] : 0.0f) + (g(at + i) * scale + x[at + i] * slope + offset);
  });
}

}  // namespace

void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta, float* y,
                         BatchNormShape s, BatchNormEpilogue e) {
  const auto run = e.residual ? (e.relu ? normalize<true, true> : normalize<true, false>)
                              : (e.relu ? normalize<false, true> : normalize<false, false>);
  run(x, stats, gamma, beta, e.residual, y, s);
}

void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                               double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                               BatchNormShape s) {
  const auto run = relu_y ? (gresidual ? backward_reduce<true, true> : backward_reduce<true, false>)
                          : (gresidual ? backward_reduce<false, true> : backward_reduce<false, false>);
  run(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, s);
}

void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                              const float* gamma, const double* grad_sums, const double* sums, GradientOut gx,
                              BatchNormShape s) {
  (relu_y ? backward_input<true> : backward_input<false>)(gy, relu_y, x, stats, gamma, grad_sums, sums, gx,
                                                          s);
}

void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) {
#pragma omp parallel for schedule(static) if (planes * plane_size > 65536)
  for (int64_t p = 0; p < planes; ++p) {
    double total = 0;
    for (int64_t i = 0; i < plane_size; ++i) total += x[p * plane_size + i];
    y[p] = static_cast<float>(total / static_cast<double>(plane_size));
  }
}

void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size) {
#pragma omp parallel for schedule(static) if (planes * plane_size > 65536)
  for (int64_t p = 0; p < planes; ++p) {
    const float g = gy[p] / static_cast<float>(plane_size);
    for (int64_t i = 0; i < plane_size; ++i) gx[p * plane_size + i] += g;
  }
}

}  // namespace dptrain::cpu
