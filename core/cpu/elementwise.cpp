// Pointwise ops, pooling, reshapes and losses on the CPU (plain loops the compiler vectorises).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace dptrain::ops {
namespace {

// y = f(x) pointwise; backward uses dy/dx written in terms of x and y.
template <typename Forward, typename Derivative>
Tensor pointwise(const Tensor& x, Forward f, Derivative dfdx) {
  Tensor out = Tensor::empty(x.shape());
  const float* xs = x.data();
  float* ys = out.data();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) ys[i] = f(xs[i]);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x}, [x, out, dfdx, n] {
      const float* xs = x.data();
      const float* ys = out.data();
      const float* gy = out.grad_data();
      float* gx = x.grad_data();
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) gx[i] += gy[i] * dfdx(xs[i], ys[i]);
    });
  }
  return out;
}

// One input plane [h, w] -> one output plane. With the kernel size known at compile time GCC
// unrolls the window and keeps the selects branch-free; with a runtime size it emits branches that
// mispredict on real activations (measured 6x slower for 2x2).
template <int64_t kFixedKernel>
void pool_plane(const float* plane, float* y, int32_t* win, int64_t h, int64_t w, int64_t runtime_kernel,
                int64_t stride) {
  const int64_t kernel = kFixedKernel > 0 ? kFixedKernel : runtime_kernel;
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; ++j) {
      const int64_t corner = i * stride * w + j * stride;
      int64_t best = corner;
      float best_value = plane[corner];
      for (int64_t ki = 0; ki < kernel; ++ki) {
        const float* row = plane + corner + ki * w;
        for (int64_t kj = 0; kj < kernel; ++kj) {
          // Strictly greater keeps the first maximum on ties; NaN wins, as in PyTorch.
          const float v = row[kj];
          const bool take = v > best_value || v != v;
          best_value = take ? v : best_value;
          best = take ? corner + ki * w + kj : best;
        }
      }
      y[i * ow + j] = best_value;
      if (win) win[i * ow + j] = static_cast<int32_t>(best);
    }
}

}  // namespace

Tensor relu(const Tensor& x) {
  return pointwise(
      x, [](float v) { return v > 0.0f ? v : 0.0f; }, [](float v, float) { return v > 0.0f ? 1.0f : 0.0f; });
}

Tensor tanh(const Tensor& x) {
  return pointwise(
      x, [](float v) { return std::tanh(v); }, [](float, float y) { return 1.0f - y * y; });
}

Tensor sigmoid(const Tensor& x) {
  return pointwise(
      x, [](float v) { return 1.0f / (1.0f + std::exp(-v)); }, [](float, float y) { return y * (1.0f - y); });
}

Tensor maxpool2d(const Tensor& x, int kernel, int stride) {
  DPTRAIN_CHECK(x.ndim() == 4, "maxpool2d: input must be [B, C, H, W], got ", shape_str(x.shape()));
  DPTRAIN_CHECK(kernel >= 1 && stride >= 1, "maxpool2d: kernel and stride must be >= 1");
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3);
  DPTRAIN_CHECK(h >= kernel && w >= kernel, "maxpool2d: kernel ", kernel, " larger than input ", shape_str(x.shape()));
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  Tensor out = Tensor::empty({x.dim(0), x.dim(1), oh, ow});
  const bool track = autograd::any_requires_grad({&x});
  // Position of each output's winner within its input plane, kept for backward.
  StoragePtr argmax = track ? make_storage(sizeof(int32_t) * out.numel()) : nullptr;
  const float* xs = x.data();
  float* ys = out.data();
  int32_t* winners = track ? argmax->as<int32_t>() : nullptr;
  const auto pool = kernel == 2 ? pool_plane<2> : kernel == 3 ? pool_plane<3> : pool_plane<0>;
#pragma omp parallel for schedule(static) if (planes * h * w > 65536)
  for (int64_t p = 0; p < planes; ++p)
    pool(xs + p * h * w, ys + p * oh * ow, winners ? winners + p * oh * ow : nullptr, h, w, kernel, stride);
  if (track) {
    autograd::record(out, {&x}, [x, out, argmax, planes, h, w, oh, ow] {
      const float* gy = out.grad_data();
      float* gx = x.grad_data();
      const int32_t* winners = argmax->as<int32_t>();
#pragma omp parallel for schedule(static) if (planes * h * w > 65536)
      for (int64_t p = 0; p < planes; ++p)
        for (int64_t o = 0; o < oh * ow; ++o) gx[p * h * w + winners[p * oh * ow + o]] += gy[p * oh * ow + o];
    });
  }
  return out;
}

Tensor reshape(const Tensor& x, Shape shape) {
  Tensor out = x.view(std::move(shape));
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x}, [x, out] {
      const float* gy = out.grad_data();
      float* gx = x.grad_data();
      for (int64_t i = 0; i < x.numel(); ++i) gx[i] += gy[i];
    });
  }
  return out;
}

Tensor flatten(const Tensor& x) {
  DPTRAIN_CHECK(x.ndim() >= 1, "flatten: needs a batch dimension");
  return reshape(x, {x.dim(0), x.numel() / std::max<int64_t>(x.dim(0), 1)});
}

Tensor dropout(const Tensor& x, float p, Rng& rng) {
  DPTRAIN_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got ", p);
  Tensor mask = Tensor::empty(x.shape());
  const float keep_scale = 1.0f / (1.0f - p);
  float* m = mask.data();
  for (int64_t i = 0; i < x.numel(); ++i) m[i] = rng.uniform() >= p ? keep_scale : 0.0f;
  Tensor out = Tensor::empty(x.shape());
  const float* xs = x.data();
  float* ys = out.data();
  for (int64_t i = 0; i < x.numel(); ++i) ys[i] = xs[i] * m[i];
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x}, [x, out, mask] {
      const float* gy = out.grad_data();
      const float* m = mask.data();
      float* gx = x.grad_data();
      for (int64_t i = 0; i < x.numel(); ++i) gx[i] += gy[i] * m[i];
    });
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits, std::span<const int32_t> labels) {
  DPTRAIN_CHECK(logits.ndim() == 2, "cross_entropy: logits must be [B, C], got ", shape_str(logits.shape()));
  const int64_t batch = logits.dim(0), classes = logits.dim(1);
  DPTRAIN_CHECK(static_cast<int64_t>(labels.size()) == batch, "cross_entropy: ", labels.size(),
                " labels for a batch of ", batch);
  DPTRAIN_CHECK(batch > 0, "cross_entropy: empty batch");
  // Softmax probabilities are kept for backward: d loss / d logits = (softmax - onehot) / B.
  Tensor probs = Tensor::empty(logits.shape());
  const float* z = logits.data();
  float* q = probs.data();
  double total = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t label = labels[b];
    DPTRAIN_CHECK(label >= 0 && label < classes, "cross_entropy: label ", label, " outside [0, ", classes, ")");
    const float* row = z + b * classes;
    const float peak = *std::max_element(row, row + classes);
    float denom = 0.0f;
    for (int64_t c = 0; c < classes; ++c) denom += (q[b * classes + c] = std::exp(row[c] - peak));
    for (int64_t c = 0; c < classes; ++c) q[b * classes + c] /= denom;
    total += std::log(denom) - (row[label] - peak);  // stable: -log softmax = log sum exp(z - max) - (z_y - max)
  }
  Tensor out = Tensor::full({1}, static_cast<float>(total / batch));
  if (autograd::any_requires_grad({&logits})) {
    std::vector<int32_t> kept(labels.begin(), labels.end());
    autograd::record(out, {&logits}, [logits, out, probs, kept = std::move(kept), batch, classes] {
      const float scale = out.grad_data()[0] / static_cast<float>(batch);
      const float* q = probs.data();
      float* g = logits.grad_data();
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t c = 0; c < classes; ++c)
          g[b * classes + c] += scale * (q[b * classes + c] - (c == kept[b] ? 1.0f : 0.0f));
    });
  }
  return out;
}

Tensor mse(const Tensor& prediction, const Tensor& target) {
  DPTRAIN_CHECK(prediction.shape() == target.shape(), "mse: prediction ", shape_str(prediction.shape()),
                " and target ", shape_str(target.shape()), " differ");
  const int64_t n = prediction.numel();
  const float* p = prediction.data();
  const float* t = target.data();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(p[i] - t[i]) * (p[i] - t[i]);
  Tensor out = Tensor::full({1}, static_cast<float>(total / n));
  if (autograd::any_requires_grad({&prediction})) {
    autograd::record(out, {&prediction}, [prediction, target, out, n] {
      const float scale = 2.0f * out.grad_data()[0] / static_cast<float>(n);
      const float* p = prediction.data();
      const float* t = target.data();
      float* g = prediction.grad_data();
      for (int64_t i = 0; i < n; ++i) g[i] += scale * (p[i] - t[i]);
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  double total = 0.0;
  for (float v : x.values()) total += v;
  Tensor out = Tensor::full({1}, static_cast<float>(total));
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x}, [x, out] {
      const float g = out.grad_data()[0];
      float* gx = x.grad_data();
      for (int64_t i = 0; i < x.numel(); ++i) gx[i] += g;
    });
  }
  return out;
}

}  // namespace dptrain::ops
