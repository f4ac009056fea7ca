// conv2d on the CPU: im2col + GEMM over chunks of the batch. A chunk's column matrix
// [C*KH*KW, chunk*OH*OW] is sized to stay in L2, so the GEMM streams from cache rather than DRAM; a
// whole-batch column matrix (18 MB for the MNIST CNN's second layer) cost more than the GEMM it
// fed. Backward recomputes each chunk's columns instead of keeping them, for the same reason.
#include <algorithm>
#include <cstring>
#include <memory>

#include "core/autograd.h"
#include "core/cpu/eigen.h"
#include "core/error.h"
#include "core/ops.h"

namespace dptrain::ops {
namespace {

struct ConvGeometry {
  int64_t batch, channels, height, width;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t out_h, out_w;
  int stride, padding;

  int64_t patch() const { return channels * kernel_h * kernel_w; }      // K: rows of the column matrix
  int64_t pixels() const { return out_h * out_w; }                       // P: outputs per sample and channel
};

// Columns per chunk: about 1 MiB of floats (this machine's L2 per core), at least one sample.
int64_t chunk_samples(const ConvGeometry& g) {
  constexpr int64_t kTargetFloats = 256 * 1024;
  return std::clamp<int64_t>(kTargetFloats / (g.patch() * g.pixels()), 1, g.batch);
}

// Output columns ow whose input column ow*s - p + kw lies inside [0, width): [begin, end).
struct ValidRange {
  int64_t begin, end;
};
ValidRange valid_columns(const ConvGeometry& g, int64_t kw) {
  auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); };
  const int64_t begin = std::clamp<int64_t>(ceil_div(g.padding - kw, g.stride), 0, g.out_w);
  const int64_t end = std::clamp<int64_t>(ceil_div(g.width + g.padding - kw, g.stride), begin, g.out_w);
  return {begin, end};
}

// For samples [first, first + count): cols[k, b*P + oh*OW + ow] = x[first + b, c, oh*s - p + kh,
// ow*s - p + kw] (0 outside), k = (c, kh, kw). Bounds are resolved per row, so the inner loop is a
// plain (for stride 1, contiguous) copy.
// Row k of the column matrix. Geometry by value: OpenMP-outlined loops re-read shared state.
void im2col_row(const ConvGeometry g, const float* x, int64_t first, int64_t count, int64_t k, float* cols) {
  const int64_t n = count * g.pixels();
  {
    const int64_t c = k / (g.kernel_h * g.kernel_w), kh = (k / g.kernel_w) % g.kernel_h, kw = k % g.kernel_w;
    const ValidRange valid = valid_columns(g, kw);
    const int64_t shift = kw - g.padding;  // input column = ow * stride + shift
    float* row = cols + k * n;
    for (int64_t b = 0; b < count; ++b) {
      const float* plane = x + ((first + b) * g.channels + c) * g.height * g.width;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t ih = oh * g.stride - g.padding + kh;
        float* dst = row + b * g.pixels() + oh * g.out_w;
        if (ih < 0 || ih >= g.height) {
          std::fill_n(dst, g.out_w, 0.0f);
          continue;
        }
        const float* src = plane + ih * g.width + shift;
        std::fill_n(dst, valid.begin, 0.0f);
        if (g.stride == 1) {
          std::copy(src + valid.begin, src + valid.end, dst + valid.begin);
        } else {
          for (int64_t ow = valid.begin; ow < valid.end; ++ow) dst[ow] = src[ow * g.stride];
        }
        std::fill(dst + valid.end, dst + g.out_w, 0.0f);
      }
    }
  }
}

void im2col(const ConvGeometry& g, const float* x, int64_t first, int64_t count, float* cols) {
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < g.patch(); ++k) im2col_row(g, x, first, count, k, cols);
}

// The adjoint of im2col for samples [first, first + count): gx[b, c, ih, iw] += gcols[k, ...].
// Parallel over channels, since every k of one channel writes the same input plane.
void col2im_channel(const ConvGeometry g, const float* gcols, int64_t first, int64_t count, int64_t c, float* gx) {
  const int64_t n = count * g.pixels();
  {
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const float* row = gcols + ((c * g.kernel_h + kh) * g.kernel_w + kw) * n;
        const ValidRange valid = valid_columns(g, kw);
        const int64_t shift = kw - g.padding;
        for (int64_t b = 0; b < count; ++b) {
          float* plane = gx + ((first + b) * g.channels + c) * g.height * g.width;
          for (int64_t oh = 0; oh < g.out_h; ++oh) {
            const int64_t ih = oh * g.stride - g.padding + kh;
            if (ih < 0 || ih >= g.height) continue;
            const float* src = row + b * g.pixels() + oh * g.out_w;
            float* dst = plane + ih * g.width + shift;
            for (int64_t ow = valid.begin; ow < valid.end; ++ow) dst[ow * g.stride] += src[ow];
          }
        }
      }
  }
}

void col2im_add(const ConvGeometry& g, const float* gcols, int64_t first, int64_t count, float* gx) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < g.channels; ++c) col2im_channel(g, gcols, first, count, c, gx);
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions options) {
  DPTRAIN_CHECK(x.ndim() == 4, "conv2d: input must be [B, C, H, W], got ", shape_str(x.shape()));
  DPTRAIN_CHECK(weight.ndim() == 4 && weight.dim(1) == x.dim(1), "conv2d: weight ", shape_str(weight.shape()),
                " ([out_c, in_c, kh, kw]) does not match input ", shape_str(x.shape()));
  DPTRAIN_CHECK(options.stride >= 1 && options.padding >= 0, "conv2d: stride must be >= 1 and padding >= 0");
  ConvGeometry g{x.dim(0), x.dim(1), x.dim(2), x.dim(3), weight.dim(0), weight.dim(2), weight.dim(3), 0, 0,
                 options.stride, options.padding};
  g.out_h = (g.height + 2 * g.padding - g.kernel_h) / g.stride + 1;
  g.out_w = (g.width + 2 * g.padding - g.kernel_w) / g.stride + 1;
  DPTRAIN_CHECK(g.out_h > 0 && g.out_w > 0, "conv2d: kernel ", g.kernel_h, "x", g.kernel_w,
                " does not fit input ", shape_str(x.shape()), " with padding ", g.padding);
  DPTRAIN_CHECK(!bias.defined() || (bias.ndim() == 1 && bias.dim(0) == g.out_channels), "conv2d: bias ",
                shape_str(bias.shape()), " does not match ", g.out_channels, " output channels");

  const int64_t K = g.patch(), P = g.pixels(), O = g.out_channels, chunk = chunk_samples(g);
  Tensor out = Tensor::empty({g.batch, O, g.out_h, g.out_w});
  {
    Storage cols(sizeof(float) * K * chunk * P), product(sizeof(float) * O * chunk * P);
    const float* bs = bias.defined() ? bias.data() : nullptr;
    const bool relu = options.fuse_relu;
    for (int64_t first = 0; first < g.batch; first += chunk) {
      const int64_t count = std::min(chunk, g.batch - first), n = count * P;
      im2col(g, x.data(), first, count, cols.as<float>());
      cpu::mat(product.as<float>(), O, n).noalias() =
          cpu::mat(weight.data(), O, K) * cpu::mat(cols.as<float>(), K, n);
      // [O, count*P] -> [count, O, P] with the bias added on the way.
      const float* y = product.as<float>();
      float* dst = out.data() + first * O * P;
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t b = 0; b < count; ++b)
        for (int64_t o = 0; o < O; ++o) {
          const float* src = y + o * n + b * P;
          float* to = dst + (b * O + o) * P;
          const float add = bs ? bs[o] : 0.0f;
          if (relu) {
            for (int64_t p = 0; p < P; ++p) to[p] = std::max(src[p] + add, 0.0f);
          } else {
            for (int64_t p = 0; p < P; ++p) to[p] = src[p] + add;
          }
        }
    }
  }

  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(out, {&x, &weight, &bias}, [x, weight, bias, out, g, K, P, O, chunk, relu = options.fuse_relu] {
      Storage cols(sizeof(float) * K * chunk * P), gy_storage(sizeof(float) * O * chunk * P);
      std::unique_ptr<Storage> gcols;
      if (x.requires_grad()) gcols = std::make_unique<Storage>(sizeof(float) * K * chunk * P);
      const float* go = out.grad_data();
      for (int64_t first = 0; first < g.batch; first += chunk) {
        const int64_t count = std::min(chunk, g.batch - first), n = count * P;
        // [count, O, P] -> [O, count*P], the layout the GEMMs want (through ReLU's mask if fused).
        float* gy = gy_storage.as<float>();
        const float* y = out.data();
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t b = 0; b < count; ++b)
          for (int64_t o = 0; o < O; ++o) {
            const int64_t at = ((first + b) * O + o) * P;
            float* to = gy + o * n + b * P;
            if (relu) {
              for (int64_t p = 0; p < P; ++p) to[p] = y[at + p] > 0.0f ? go[at + p] : 0.0f;
            } else {
              std::memcpy(to, go + at, sizeof(float) * P);
            }
          }
        auto gy_mat = cpu::mat(static_cast<const float*>(gy), O, n);
        if (bias.defined() && bias.requires_grad()) Eigen::Map<Eigen::VectorXf>(bias.grad_data(), O) += gy_mat.rowwise().sum();
        if (weight.requires_grad()) {
          im2col(g, x.data(), first, count, cols.as<float>());
          cpu::mat(weight.grad_data(), O, K).noalias() +=
              gy_mat * cpu::mat(static_cast<const float*>(cols.as<float>()), K, n).transpose();
        }
        if (x.requires_grad()) {
          cpu::mat(gcols->as<float>(), K, n).noalias() = cpu::mat(weight.data(), O, K).transpose() * gy_mat;
          col2im_add(g, gcols->as<float>(), first, count, x.grad_data());
        }
      }
    });
  }
  return out;
}

}  // namespace dptrain::ops
