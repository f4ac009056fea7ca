// The reference backend: every kernel as the plain loops of its definition, accumulating in double,
// with no Eigen, no blocking and no threads. It is the oracle the other backends are tested against
// (tests/core/backend_conformance_test.cpp), never a product path: slow on purpose, obvious on purpose.
#include "core/reference/backend.h"

#include <cmath>
#include <vector>

#include "core/activation_rules.h"
#include "core/rng.h"

namespace dptrain::reference {
namespace {

float round_to_float(double v) {
  return static_cast<float>(v);
}

// What a gradient held before this kernel's contribution: nothing when the kernel writes it.
float held(GradientOut g, std::size_t i) {
  return g.overwrite ? 0.0f : g.data[i];
}

}  // namespace

void ReferenceBackend::matmul(const float* a, const float* b, float* y, MatmulShape s) {
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < s.k; ++k) acc += static_cast<double>(a[i * s.k + k]) * b[k * s.n + j];
      y[i * s.n + j] = round_to_float(acc);
    }
}

void ReferenceBackend::matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb,
                                       MatmulShape s) {
  if (ga)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t k = 0; k < s.k; ++k) {
        double acc = 0;
        for (int64_t j = 0; j < s.n; ++j) acc += static_cast<double>(gy[i * s.n + j]) * b[k * s.n + j];
        ga[i * s.k + k] = round_to_float(ga[i * s.k + k] + acc);
      }
  if (gb)
    for (int64_t k = 0; k < s.k; ++k)
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < s.m; ++i) acc += static_cast<double>(a[i * s.k + k]) * gy[i * s.n + j];
        gb[k * s.n + j] = round_to_float(gb[k * s.n + j] + acc);
      }
}

void ReferenceBackend::linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t o = 0; o < s.out; ++o) {
      double acc = bias ? bias[o] : 0.0;
      for (int64_t i = 0; i < s.in; ++i) acc += static_cast<double>(x[b * s.in + i]) * w[o * s.in + i];
      y[b * s.out + o] = round_to_float(acc);
    }
}

void ReferenceBackend::linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw,
                                       float* gbias, LinearShape s) {
  if (gx)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < s.in; ++i) {
        double acc = 0;
        for (int64_t o = 0; o < s.out; ++o) acc += static_cast<double>(gy[b * s.out + o]) * w[o * s.in + i];
        gx[b * s.in + i] = round_to_float(gx[b * s.in + i] + acc);
      }
  if (gw)
    for (int64_t o = 0; o < s.out; ++o)
      for (int64_t i = 0; i < s.in; ++i) {
        double acc = 0;
        for (int64_t b = 0; b < s.batch; ++b) acc += static_cast<double>(gy[b * s.out + o]) * x[b * s.in + i];
        gw[o * s.in + i] = round_to_float(gw[o * s.in + i] + acc);
      }
  if (gbias)
    for (int64_t o = 0; o < s.out; ++o) {
      double acc = 0;
      for (int64_t b = 0; b < s.batch; ++b) acc += gy[b * s.out + o];
      gbias[o] = round_to_float(gbias[o] + acc);
    }
}

void ReferenceBackend::add_bias(const float* x, const float* bias, float* y, BiasShape s) {
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t c = 0; c < s.channels; ++c)
      for (int64_t i = 0; i < s.inner; ++i) {
        const int64_t at = (o * s.channels + c) * s.inner + i;
        y[at] = x[at] + bias[c];
      }
}

void ReferenceBackend::add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) {
  if (gx) add(gy, gx, s.outer * s.channels * s.inner);
  if (gbias)
    for (int64_t c = 0; c < s.channels; ++c) {
      double acc = 0;
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i) acc += gy[(o * s.channels + c) * s.inner + i];
      gbias[c] = round_to_float(gbias[c] + acc);
    }
}

namespace {

// Calls visit(input index, weight index) for every input pixel that output (b, o, oh, ow) reads,
// by the definition: input row oh * stride - padding + kh, column ow * stride - padding + kw.
template <typename Visit>
void for_each_tap(const Conv2dGeometry& g, int64_t b, int64_t o, int64_t oh, int64_t ow, Visit visit) {
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const int64_t ih = oh * g.stride - g.padding + kh, iw = ow * g.stride - g.padding + kw;
        if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
        visit(((b * g.channels + c) * g.height + ih) * g.width + iw,
              ((o * g.channels + c) * g.kernel_h + kh) * g.kernel_w + kw);
      }
}

int64_t output_index(const Conv2dGeometry& g, int64_t b, int64_t o, int64_t oh, int64_t ow) {
  return ((b * g.out_channels + o) * g.out_h + oh) * g.out_w + ow;
}

}  // namespace

void ReferenceBackend::conv2d(const float* x, const float* w, const float* bias, float* y,
                              const Conv2dGeometry& g) {
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t oh = 0; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          double acc = bias ? bias[o] : 0.0;
          for_each_tap(g, b, o, oh, ow,
                       [&](int64_t in, int64_t wi) { acc += static_cast<double>(x[in]) * w[wi]; });
          if (g.fuse_relu && acc < 0) acc = 0;
          y[output_index(g, b, o, oh, ow)] = round_to_float(acc);
        }
}

void ReferenceBackend::conv2d_backward(const float* gy, const float* x, const float* w, const float* y,
                                       GradientOut gx, float* gw, float* gbias, const Conv2dGeometry& g) {
  std::vector<double> dx(gx ? static_cast<std::size_t>(g.batch * g.channels * g.height * g.width) : 0);
  std::vector<double> dw(gw ? static_cast<std::size_t>(g.out_channels * g.patch()) : 0);
  std::vector<double> db(gbias ? static_cast<std::size_t>(g.out_channels) : 0);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t oh = 0; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const int64_t at = output_index(g, b, o, oh, ow);
          // ReLU passes the gradient where its output is positive.
          const double grad = g.fuse_relu && !(y[at] > 0.0f) ? 0.0 : gy[at];
          if (gbias) db[o] += grad;
          for_each_tap(g, b, o, oh, ow, [&](int64_t in, int64_t wi) {
            if (gx) dx[in] += grad * w[wi];
            if (gw) dw[wi] += grad * x[in];
          });
        }
  for (std::size_t i = 0; i < dx.size(); ++i) gx.data[i] = round_to_float(held(gx, i) + dx[i]);
  for (std::size_t i = 0; i < dw.size(); ++i) gw[i] = round_to_float(gw[i] + dw[i]);
  for (std::size_t i = 0; i < db.size(); ++i) gbias[i] = round_to_float(gbias[i] + db[i]);
}

void ReferenceBackend::maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) {
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t i = 0; i < g.out_h; ++i)
      for (int64_t j = 0; j < g.out_w; ++j) {
        const float* plane = x + p * g.height * g.width;
        int64_t best = -1;
        for (int64_t ki = 0; ki < g.kernel; ++ki)
          for (int64_t kj = 0; kj < g.kernel; ++kj) {
            const int64_t r = i * g.stride - g.padding + ki, c = j * g.stride - g.padding + kj;
            if (r < 0 || r >= g.height || c < 0 || c >= g.width) continue;  // padding takes no part
            const int64_t at = r * g.width + c;
            // The first maximum in row-major window order; a NaN beats everything after it.
            if (best < 0 || plane[at] > plane[best] || std::isnan(plane[at])) best = at;
          }
        y[p * g.out_h * g.out_w + i * g.out_w + j] = plane[best];
        if (argmax) argmax[p * g.out_h * g.out_w + i * g.out_w + j] = static_cast<int32_t>(best);
      }
}

void ReferenceBackend::maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                                          const Pool2dGeometry& g) {
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t o = 0; o < g.out_h * g.out_w; ++o)
      gx[p * g.height * g.width + argmax[p * g.out_h * g.out_w + o]] += gy[p * g.out_h * g.out_w + o];
}

// ---- batch normalisation: the formulas of core/backend.h, per element, in double ----

namespace {
// x[b, c, i] for the visit of every element of channel c.
template <typename Visit>
void for_channel(BatchNormShape s, int64_t c, Visit visit) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.inner; ++i) visit((b * s.channels + c) * s.inner + i);
}
}  // namespace

void ReferenceBackend::batchnorm_sums(const float* x, double* sums, BatchNormShape s) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double total = 0;
    for_channel(s, c, [&](int64_t at) { total += x[at]; });
    sums[c] = total;
  }
  sums[s.channels] = static_cast<double>(s.batch * s.inner);
}

void ReferenceBackend::batchnorm_squares(const float* x, const double* sums, double* squares,
                                         BatchNormShape s) {
  for (int64_t c = 0; c < s.channels; ++c) {
    const double mean = sums[c] / sums[s.channels];
    double total = 0;
    for_channel(s, c, [&](int64_t at) { total += (x[at] - mean) * (x[at] - mean); });
    squares[c] = total;
  }
}

void ReferenceBackend::batchnorm_batch_stats(const double* sums, const double* squares, float* stats,
                                             float* running_mean, float* running_var, int64_t channels,
                                             float eps, float momentum) {
  const double count = sums[channels];
  for (int64_t c = 0; c < channels; ++c) {
    const double mean = sums[c] / count, var = squares[c] / count;
    stats[c] = round_to_float(mean);
    stats[channels + c] = round_to_float(1.0 / std::sqrt(var + eps));
    if (running_mean) {
      const double unbiased = count > 1 ? squares[c] / (count - 1) : var;
      running_mean[c] = round_to_float((1.0 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = round_to_float((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

void ReferenceBackend::batchnorm_running_stats(const float* running_mean, const float* running_var,
                                               float* stats, int64_t channels, float eps) {
  for (int64_t c = 0; c < channels; ++c) {
    stats[c] = running_mean[c];
    stats[channels + c] = round_to_float(1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps));
  }
}

void ReferenceBackend::batchnorm_normalize(const float* x, const float* stats, const float* gamma,
                                           const float* beta, float* y, BatchNormShape s,
                                           BatchNormEpilogue e) {
  for (int64_t c = 0; c < s.channels; ++c)
    for_channel(s, c, [&](int64_t at) {
      float v = round_to_float((x[at] - static_cast<double>(stats[c])) * stats[s.channels + c] * gamma[c] +
                               beta[c]);
      if (e.residual) v += e.residual[at];
      y[at] = e.relu ? relu_of(v) : v;
    });
}

void ReferenceBackend::batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x,
                                                 const float* stats, double* grad_sums, float* ggamma,
                                                 float* gbeta, GradientOut gresidual, BatchNormShape s) {
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum_gy = 0, sum_gy_xmu = 0;
    for_channel(s, c, [&](int64_t at) {
      const float g = relu_y ? relu_gradient(gy[at], relu_y[at]) : gy[at];
      sum_gy += g;
      sum_gy_xmu += static_cast<double>(g) * (x[at] - static_cast<double>(stats[c]));
      if (gresidual) gresidual.data[at] = held(gresidual, static_cast<std::size_t>(at)) + g;
    });
    grad_sums[c] = sum_gy;
    grad_sums[s.channels + c] = sum_gy_xmu;
    if (ggamma) ggamma[c] = round_to_float(ggamma[c] + sum_gy_xmu * stats[s.channels + c]);
    if (gbeta) gbeta[c] = round_to_float(gbeta[c] + sum_gy);
  }
}

void ReferenceBackend::batchnorm_backward_input(const float* gy, const float* relu_y, const float* x,
                                                const float* stats, const float* gamma,
                                                const double* grad_sums, const double* sums, GradientOut gx,
                                                BatchNormShape s) {
  for (int64_t c = 0; c < s.channels; ++c) {
    const double mean = stats[c], invstd = stats[s.channels + c], scale = gamma[c] * invstd;
    for_channel(s, c, [&](int64_t at) {
      double g = relu_y ? relu_gradient(gy[at], relu_y[at]) : gy[at];
      if (grad_sums) {
        const double count = sums[s.channels];
        g -= grad_sums[c] / count + (x[at] - mean) * invstd * invstd * grad_sums[s.channels + c] / count;
      }
      gx.data[at] = round_to_float(held(gx, static_cast<std::size_t>(at)) + scale * g);
    });
  }
}

void ReferenceBackend::mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) {
  for (int64_t p = 0; p < planes; ++p) {
    double total = 0;
    for (int64_t i = 0; i < plane_size; ++i) total += x[p * plane_size + i];
    y[p] = round_to_float(total / static_cast<double>(plane_size));
  }
}

void ReferenceBackend::mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size) {
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < plane_size; ++i)
      gx[p * plane_size + i] =
          round_to_float(gx[p * plane_size + i] + static_cast<double>(gy[p]) / plane_size);
}

void ReferenceBackend::activation(Activation f, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    switch (f) {
      case Activation::kRelu:
        y[i] = relu_of(x[i]);
        break;
      case Activation::kTanh:
        y[i] = round_to_float(std::tanh(v));
        break;
      case Activation::kSigmoid:
        y[i] = round_to_float(1.0 / (1.0 + std::exp(-v)));
        break;
    }
  }
}

void ReferenceBackend::activation_backward(Activation f, const float* x, const float* y, const float* gy,
                                           float* gx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double derivative = 0;
    switch (f) {
      case Activation::kRelu:
        derivative = x[i] > 0 ? 1 : 0;
        break;
      case Activation::kTanh:
        derivative = 1 - static_cast<double>(y[i]) * y[i];
        break;
      case Activation::kSigmoid:
        derivative = static_cast<double>(y[i]) * (1 - static_cast<double>(y[i]));
        break;
    }
    gx[i] = round_to_float(gx[i] + gy[i] * derivative);
  }
}

void ReferenceBackend::dropout(const float* x, float* y, float* mask, int64_t n, float p,
                               uint64_t rng_state) {
  const float keep_scale = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < n; ++i) {
    mask[i] =
        uniform_from_bits(splitmix64_draw(rng_state, static_cast<uint64_t>(i))) >= p ? keep_scale : 0.0f;
    y[i] = x[i] * mask[i];
  }
}

void ReferenceBackend::dropout_backward(const float* gy, const float* mask, float* gx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gx[i] += gy[i] * mask[i];
}

void ReferenceBackend::add(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void ReferenceBackend::cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs,
                                     float* loss, int64_t batch, int64_t classes) {
  double total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = logits + b * classes;
    double peak = row[0];
    for (int64_t c = 1; c < classes; ++c) peak = std::max(peak, static_cast<double>(row[c]));
    double denom = 0;
    for (int64_t c = 0; c < classes; ++c) denom += std::exp(row[c] - peak);
    for (int64_t c = 0; c < classes; ++c)
      probs[b * classes + c] = round_to_float(std::exp(row[c] - peak) / denom);
    total += std::log(denom) - (row[labels[b]] - peak);
  }
  *loss = round_to_float(total / static_cast<double>(batch));
}

void ReferenceBackend::cross_entropy_backward(const float* probs, std::span<const int32_t> labels,
                                              const float* gloss, float* glogits, int64_t batch,
                                              int64_t classes) {
  const double scale = static_cast<double>(gloss[0]) / static_cast<double>(batch);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < classes; ++c) {
      const int64_t at = b * classes + c;
      glogits[at] = round_to_float(glogits[at] + scale * (probs[at] - (c == labels[b] ? 1.0 : 0.0)));
    }
}

void ReferenceBackend::mse(const float* prediction, const float* target, float* loss, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(prediction[i]) - target[i];
    total += d * d;
  }
  *loss = round_to_float(total / static_cast<double>(n));
}

void ReferenceBackend::mse_backward(const float* prediction, const float* target, const float* gloss,
                                    float* gprediction, int64_t n) {
  const double scale = 2.0 * gloss[0] / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i)
    gprediction[i] =
        round_to_float(gprediction[i] + scale * (static_cast<double>(prediction[i]) - target[i]));
}

void ReferenceBackend::sum(const float* x, float* out, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += x[i];
  *out = round_to_float(total);
}

void ReferenceBackend::sum_backward(const float* gout, float* gx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gx[i] += gout[0];
}

// The portable conversions of core/half.h, element by element: no F16C, no vector tricks.
void ReferenceBackend::to_half(const float* x, uint16_t* y, int64_t n, float scale, HalfFormat format) {
  for (int64_t i = 0; i < n; ++i)
    y[i] =
        format == HalfFormat::kFp16 ? float_to_half_portable(x[i] * scale) : float_to_bfloat16(x[i] * scale);
}

void ReferenceBackend::from_half(const uint16_t* x, float* y, int64_t n, HalfFormat format) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = format == HalfFormat::kFp16 ? half_to_float_portable(x[i]) : bfloat16_to_float(x[i]);
}

bool ReferenceBackend::all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// In long double, one element after another: the reference for the CPU's and the GPU's blocked sums.
double ReferenceBackend::sum_of_squares(const float* x, int64_t n) {
  long double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<long double>(x[i]) * x[i];
  return static_cast<double>(sum);
}

// The update rules in double, rounded once per stored value: the optimizers' reference. The gradient
// clipping scales is the float it would be after clip_grad_norm_'s in-place multiplication.
void ReferenceBackend::sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n,
                                const SgdStep& s) {
  if (s.skip_if_set != nullptr && *s.skip_if_set != 0) return;
  for (int64_t i = 0; i < n; ++i) {
    const float grad = grads[i] * s.grad_scale;
    const double d = static_cast<double>(grad) + static_cast<double>(s.weight_decay) * params[i];
    double step = d;
    if (s.momentum != 0.0f) {
      const double buf =
          s.first_step ? d : s.momentum * static_cast<double>(momentum_buffer[i]) + (1.0 - s.dampening) * d;
      momentum_buffer[i] = round_to_float(buf);
      step = s.nesterov ? d + s.momentum * buf : buf;
    }
    params[i] = round_to_float(params[i] - static_cast<double>(s.lr) * step);
  }
}

void ReferenceBackend::adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                                 int64_t n, const AdamStep& s) {
  if (s.skip_if_set != nullptr && *s.skip_if_set != 0) return;
  for (int64_t i = 0; i < n; ++i) {
    const double p = static_cast<double>(params[i]) * s.decay;
    const float grad = grads[i] * s.grad_scale;
    const double g = grad + static_cast<double>(s.l2) * p;
    const double m = s.beta1 * static_cast<double>(exp_avg[i]) + (1.0 - s.beta1) * g;
    const double v = s.beta2 * static_cast<double>(exp_avg_sq[i]) + (1.0 - s.beta2) * g * g;
    exp_avg[i] = round_to_float(m);
    exp_avg_sq[i] = round_to_float(v);
    params[i] = round_to_float(p - s.step_size * m / (std::sqrt(v) / s.bias_correction2_sqrt + s.eps));
  }
}

}  // namespace dptrain::reference
