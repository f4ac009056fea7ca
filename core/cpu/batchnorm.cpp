// Batch normalisation and global average pooling on the CPU. Per-channel sums accumulate in double
// (a float running sum over 400k elements of a ResNet-50 stem channel loses about 5 digits) and
// stay double until the statistics are formed; the elementwise passes run over (sample, channel)
// planes, contiguous and vectorised. The epilogue (+ residual, ReLU) and its backward are compiled in
// per variant, so that the plain normalisation's loops stay as they were.
//
// Training without SyncBatchNorm runs each direction as one call. The forward takes a channel's sum
// and its squares back to back, the second from cache; above a size it normalises the channel next,
// again from cache, and below it normalises as the separate kernel does. Above that size the
// backward takes a channel's reduction and then its input gradient, the second pass from cache (a
// channel is at most 784 kB per tensor in ResNet-50 at batch 16). Both forms run the same out-of-line
// per-channel sums in the same order, and the same elementwise arithmetic, so their results agree
// bit for bit with the separate kernels'. Above that size what they write (rather than add into) goes to
// memory by streamed stores, which do not read the lines they fill first.
#include <cmath>
#include <vector>

#include "core/activation_rules.h"
#include "core/cpu/kernels.h"
#include "core/cpu/packet.h"

namespace dptrain::cpu {
namespace {

bool worth_threads(BatchNormShape s) {
  return s.batch * s.channels * s.inner > 65536;
}

// Up to this many elements (1 MiB of floats) a tensor stays in cache between passes over it, so that
// a second pass costs nothing from memory: there the passes go over whole planes, and a channel at a
// time would only scatter the accesses (in backward, 1.14x the separate kernels' time over 8x8
// planes, 1.25x over 4x4). Above it both directions take a channel's passes back to back, the later
// ones from cache.
constexpr int64_t kCachedElements = int64_t{1} << 18;
bool fits_in_cache(BatchNormShape s) {
  return s.batch * s.channels * s.inner <= kCachedElements;
}

// Calls f(c) for every channel. Threads split the channels: each channel's sum has one owner, so
// results do not depend on the thread count.
template <typename F>
void for_each_channel(BatchNormShape s, F f) {
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (int64_t c = 0; c < s.channels; ++c) f(c);
}

// Calls f(c, first element) for every [inner] plane of the batch.
template <typename F>
void for_each_plane(BatchNormShape s, F f) {
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (int64_t p = 0; p < s.batch * s.channels; ++p) f(p % s.channels, p * s.inner);
}

// Calls f(first element) for channel c's plane of every sample, in sample order.
template <typename F>
void for_each_plane_of(int64_t c, BatchNormShape s, F f) {
  for (int64_t b = 0; b < s.batch; ++b) f((b * s.channels + c) * s.inner);
}

// The reductions below are out of line, so that the separate kernels and the fused ones run the
// same machine code: a sum inlined into another body may be vectorised (and its partial sums split)
// another way. Elementwise loops give the same bits however they are vectorised, and stay inline.

// Each plane (at most 112 x 112 here) summed in float, vectorised; the planes are added in double.
[[gnu::noinline]] double channel_sum(const float* x, int64_t c, BatchNormShape s) {
  double total = 0;
  for_each_plane_of(c, s, [&](int64_t at) {
    float partial = 0;
#pragma omp simd reduction(+ : partial)
    for (int64_t i = 0; i < s.inner; ++i) partial += x[at + i];
    total += partial;
  });
  return total;
}

[[gnu::noinline]] double channel_squares(const float* x, const double* sums, int64_t c, BatchNormShape s) {
  const auto mean = static_cast<float>(sums[c] / sums[s.channels]);  // the mean normalisation uses
  double total = 0;
  for_each_plane_of(c, s, [&](int64_t at) {
    float partial = 0;
#pragma omp simd reduction(+ : partial)
    for (int64_t i = 0; i < s.inner; ++i) partial += (x[at + i] - mean) * (x[at + i] - mean);
    total += partial;
  });
  return total;
}

[[gnu::noinline]] void channel_batch_stats(int64_t c, const double* sums, const double* squares, float* stats,
                                           float* running_mean, float* running_var, int64_t channels,
                                           float eps, float momentum) {
  const double count = sums[channels];
  const double mean = sums[c] / count, var = squares[c] / count;
  stats[c] = static_cast<float>(mean);
  stats[channels + c] = static_cast<float>(1.0 / std::sqrt(var + eps));
  if (running_mean) {
    const double unbiased = count > 1 ? squares[c] / (count - 1) : var;
    running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * unbiased);
  }
}

// y = x * scale + shift over one plane (one multiply-add per element), then the epilogue.
struct Affine {
  float scale, shift;
  Affine(const float* stats, const float* gamma, const float* beta, int64_t c, int64_t channels)
      : scale(stats[channels + c] * gamma[c]), shift(beta[c] - stats[c] * scale) {}
};

template <bool kResidual, bool kRelu>
void normalize_plane(const float* x, const float* residual, float* y, Affine a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * a.scale + a.shift;
    if constexpr (kResidual) v += residual[i];
    y[i] = kRelu ? relu_of(v) : v;
  }
}

template <bool kResidual, bool kRelu>
void normalize(const float* x, const float* stats, const float* gamma, const float* beta,
               const float* residual, float* y, BatchNormShape s) {
  for_each_plane(s, [&](int64_t c, int64_t at) {
    normalize_plane<kResidual, kRelu>(x + at, kResidual ? residual + at : nullptr, y + at,
                                      Affine(stats, gamma, beta, c, s.channels), s.inner);
  });
}

// normalize's planes of channel c alone, above the cache's size: streamed to memory where the planes
// are aligned (ResNet-50's BatchNorm forward 184 -> 163 ms a step on one Intel Xeon core).
template <bool kResidual, bool kRelu>
void normalize_channel_planes(const float* x, const float* stats, const float* gamma, const float* beta,
                              const float* residual, float* y, int64_t c, BatchNormShape s) {
  const Affine a(stats, gamma, beta, c, s.channels);
  for_each_plane_of(c, s, [&](int64_t at) {
    const float* r = kResidual ? residual + at : nullptr;
    if (!simd::streamable(y + at, s.inner))
      return normalize_plane<kResidual, kRelu>(x + at, r, y + at, a, s.inner);
    simd::write_streamed(y + at, s.inner, [&](float* piece, int64_t first, int64_t count) {
      normalize_plane<kResidual, kRelu>(x + at + first, kResidual ? r + first : nullptr, piece, a, count);
    });
  });
  simd::stream_fence();
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

// With `stream`, a residual gradient that is written rather than added into goes to memory by
// streamed stores where its planes are aligned (simd::write_streamed).
template <bool kRelu, bool kResidual>
void reduce_channel(const float* gy, const float* relu_y, const float* x, const float* stats,
                    double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual, int64_t c,
                    BatchNormShape s, bool stream) {
  const bool add = !gresidual.overwrite;
  // The plane's gradient through the ReLU, while it is in L1 (a ResNet plane is at most 49 kB).
  thread_local std::vector<float> masked;
  if (kRelu) masked.resize(static_cast<std::size_t>(s.inner));
  const float mean = stats[c];
  double sum_gy = 0, sum_gy_xmu = 0;
  for_each_plane_of(c, s, [&](int64_t at) {
    const float* g = gy + at;
    if constexpr (kRelu) {
#pragma omp simd
      for (int64_t i = 0; i < s.inner; ++i) masked[i] = relu_gradient(gy[at + i], relu_y[at + i]);
      g = masked.data();
    }
    if constexpr (kResidual) {
      if (stream && !add && simd::streamable(gresidual.data + at, s.inner)) {
        simd::write_streamed(gresidual.data + at, s.inner, [&](float* piece, int64_t first, int64_t count) {
#pragma omp simd
          for (int64_t i = 0; i < count; ++i) piece[i] = 0.0f + g[first + i];
        });
      } else {
#pragma omp simd
        for (int64_t i = 0; i < s.inner; ++i)
          gresidual.data[at + i] = (add ? gresidual.data[at + i] : 0.0f) + g[i];
      }
    }
    float partial_gy, partial_gy_xmu;
    plane_gradient_sums(g, x + at, mean, s.inner, partial_gy, partial_gy_xmu);
    sum_gy += partial_gy;
    sum_gy_xmu += partial_gy_xmu;
  });
  grad_sums[c] = sum_gy;
  grad_sums[s.channels + c] = sum_gy_xmu;
  if (ggamma) ggamma[c] += static_cast<float>(sum_gy_xmu * stats[s.channels + c]);
  if (gbeta) gbeta[c] += static_cast<float>(sum_gy);
}

// Channel c's input gradient, g * scale + x * slope + offset. With the batch's statistics
// (grad_sums), gx = scale * (g - mean_g - (x - mean) * invstd^2 * mean_g_xmu): two multiply-adds per
// element. With fixed statistics (evaluation), which do not depend on x, gx = scale * g.
struct InputGradient {
  float scale, slope = 0, offset = 0;
  bool batch_statistics;
  InputGradient(const float* stats, const float* gamma, const double* grad_sums, const double* sums,
                int64_t c, int64_t channels)
      : scale(gamma[c] * stats[channels + c]), batch_statistics(grad_sums != nullptr) {
    if (!batch_statistics) return;
    const float mean = stats[c], invstd = stats[channels + c];
    const double count = sums[channels];
    const auto mean_gy = static_cast<float>(grad_sums[c] / count);
    const auto mean_gy_xmu = static_cast<float>(grad_sums[channels + c] / count);
    slope = -scale * invstd * invstd * mean_gy_xmu;
    offset = -scale * mean_gy - slope * mean;
  }
};

// One plane of it, added into gx, or written (add false) as 0 + v, the bits of adding into zeros.
template <bool kRelu>
void input_gradient_plane(const float* gy, const float* relu_y, const float* x, float* gx, bool add,
                          InputGradient f, int64_t n) {
  const auto g = [&](int64_t i) { return kRelu ? relu_gradient(gy[i], relu_y[i]) : gy[i]; };
  if (!f.batch_statistics) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) gx[i] = (add ? gx[i] : 0.0f) + f.scale * g(i);
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) gx[i] = (add ? gx[i] : 0.0f) + (g(i) * f.scale + x[i] * f.slope + f.offset);
}

template <bool kRelu, bool kResidual>
void backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                     double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                     BatchNormShape s) {
  for_each_channel(s, [&](int64_t c) {
    reduce_channel<kRelu, kResidual>(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, c, s,
                                     /*stream=*/false);
  });
}

template <bool kRelu>
void backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                    const float* gamma, const double* grad_sums, const double* sums, GradientOut gx,
                    BatchNormShape s) {
  for_each_plane(s, [&](int64_t c, int64_t at) {
    input_gradient_plane<kRelu>(gy + at, kRelu ? relu_y + at : nullptr, x + at, gx.data + at, !gx.overwrite,
                                InputGradient(stats, gamma, grad_sums, sums, c, s.channels), s.inner);
  });
}

template <bool kRelu, bool kResidual>
void train_backward(const float* gy, const float* relu_y, const float* x, const float* stats,
                    const float* gamma, const double* sums, double* grad_sums, float* ggamma, float* gbeta,
                    GradientOut gresidual, GradientOut gx, BatchNormShape s) {
  // Above the cache's size the gradients that are written rather than added into are streamed to
  // memory (ResNet-50's BatchNorm backward 348 -> 311 ms a step on one Intel Xeon core).
  for_each_channel(s, [&](int64_t c) {
    reduce_channel<kRelu, kResidual>(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, c, s,
                                     /*stream=*/true);
    if (!gx) return simd::stream_fence();
    const InputGradient f(stats, gamma, grad_sums, sums, c, s.channels);
    for_each_plane_of(c, s, [&](int64_t at) {
      const float* r = kRelu ? relu_y + at : nullptr;
      if (!gx.overwrite || !simd::streamable(gx.data + at, s.inner))
        return input_gradient_plane<kRelu>(gy + at, r, x + at, gx.data + at, !gx.overwrite, f, s.inner);
      simd::write_streamed(gx.data + at, s.inner, [&](float* piece, int64_t first, int64_t count) {
        input_gradient_plane<kRelu>(gy + at + first, kRelu ? r + first : nullptr, x + at + first, piece,
                                    /*add=*/false, f, count);
      });
    });
    simd::stream_fence();
  });
}

}  // namespace

void batchnorm_sums(const float* x, double* sums, BatchNormShape s) {
  for_each_channel(s, [&](int64_t c) { sums[c] = channel_sum(x, c, s); });
  sums[s.channels] = static_cast<double>(s.batch * s.inner);
}

void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) {
  for_each_channel(s, [&](int64_t c) { squares[c] = channel_squares(x, sums, c, s); });
}

void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                           float* running_var, int64_t channels, float eps, float momentum) {
  for (int64_t c = 0; c < channels; ++c)
    channel_batch_stats(c, sums, squares, stats, running_mean, running_var, channels, eps, momentum);
}

void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                             int64_t channels, float eps) {
  for (int64_t c = 0; c < channels; ++c) {
    stats[c] = running_mean[c];
    stats[channels + c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps));
  }
}

void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta, float* y,
                         BatchNormShape s, BatchNormEpilogue e) {
  const auto run = e.residual ? (e.relu ? normalize<true, true> : normalize<true, false>)
                              : (e.relu ? normalize<false, true> : normalize<false, false>);
  run(x, stats, gamma, beta, e.residual, y, s);
}

void batchnorm_train_forward(const float* x, const float* gamma, const float* beta, double* sums,
                             double* squares, float* stats, float* running_mean, float* running_var, float* y,
                             BatchNormShape s, BatchNormEpilogue e, float eps, float momentum) {
  sums[s.channels] = static_cast<double>(s.batch * s.inner);
  const bool cached = fits_in_cache(s);
  const auto normalize_channel =
      e.residual ? (e.relu ? normalize_channel_planes<true, true> : normalize_channel_planes<true, false>)
                 : (e.relu ? normalize_channel_planes<false, true> : normalize_channel_planes<false, false>);
  for_each_channel(s, [&](int64_t c) {
    sums[c] = channel_sum(x, c, s);
    squares[c] = channel_squares(x, sums, c, s);
    channel_batch_stats(c, sums, squares, stats, running_mean, running_var, s.channels, eps, momentum);
    // The channel's third pass while it is still in cache: a pass over planes would read the input
    // from memory a second time.
    if (!cached) normalize_channel(x, stats, gamma, beta, e.residual, y, c, s);
  });
  if (cached) batchnorm_normalize(x, stats, gamma, beta, y, s, e);
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

void batchnorm_train_backward(const float* gy, const float* relu_y, const float* x, const float* stats,
                              const float* gamma, const double* sums, double* grad_sums, float* ggamma,
                              float* gbeta, GradientOut gresidual, GradientOut gx, BatchNormShape s) {
  if (fits_in_cache(s)) {
    batchnorm_backward_reduce(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, s);
    if (gx) batchnorm_backward_input(gy, relu_y, x, stats, gamma, grad_sums, sums, gx, s);
    return;
  }
  const auto run = relu_y ? (gresidual ? train_backward<true, true> : train_backward<true, false>)
                          : (gresidual ? train_backward<false, true> : train_backward<false, false>);
  run(gy, relu_y, x, stats, gamma, sums, grad_sums, ggamma, gbeta, gresidual, gx, s);
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
