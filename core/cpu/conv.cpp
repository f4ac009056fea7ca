// conv2d on the CPU: im2col + GEMM over chunks of the batch. A chunk's column matrix
// [C*KH*KW, chunk*OH*OW] is sized to stay in L2, so the GEMM streams from cache rather than DRAM; a
// whole-batch column matrix (18 MB for the MNIST CNN's second layer) cost more than the GEMM it
// fed. Backward recomputes each chunk's columns instead of keeping them, for the same reason.
#include <algorithm>
#include <cstring>
#include <memory>

#include "core/cpu/eigen.h"
#include "core/cpu/kernels.h"
#include "core/storage.h"

namespace dptrain::cpu {
namespace {

// K = patch(): rows of the column matrix; P = pixels(): outputs per sample and channel.
using ConvGeometry = Conv2dGeometry;

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
void col2im_channel(const ConvGeometry g, const float* gcols, int64_t first, int64_t count, int64_t c,
                    float* gx) {
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

void conv2d(const float* x, const float* w, const float* bias, float* y, const Conv2dGeometry& g) {
  const int64_t K = g.patch(), P = g.pixels(), O = g.out_channels, chunk = chunk_samples(g);
  Storage cols(sizeof(float) * K * chunk * P), product(sizeof(float) * O * chunk * P);
  for (int64_t first = 0; first < g.batch; first += chunk) {
    const int64_t count = std::min(chunk, g.batch - first), n = count * P;
    im2col(g, x, first, count, cols.as<float>());
    mat(product.as<float>(), O, n).noalias() = mat(w, O, K) * mat(cols.as<float>(), K, n);
    // [O, count*P] -> [count, O, P] with the bias added on the way.
    const float* product_data = product.as<float>();
    float* dst = y + first * O * P;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < count; ++b)
      for (int64_t o = 0; o < O; ++o) {
        const float* src = product_data + o * n + b * P;
        float* to = dst + (b * O + o) * P;
        const float add = bias ? bias[o] : 0.0f;
        if (g.fuse_relu) {
          for (int64_t p = 0; p < P; ++p) to[p] = std::max(src[p] + add, 0.0f);
        } else {
          for (int64_t p = 0; p < P; ++p) to[p] = src[p] + add;
        }
      }
  }
}

void conv2d_backward(const float* go, const float* x, const float* w, const float* y, float* gx, float* gw,
                     float* gbias, const Conv2dGeometry& g) {
  const int64_t K = g.patch(), P = g.pixels(), O = g.out_channels, chunk = chunk_samples(g);
  Storage cols(sizeof(float) * K * chunk * P), gy_storage(sizeof(float) * O * chunk * P);
  std::unique_ptr<Storage> gcols;
  if (gx) gcols = std::make_unique<Storage>(sizeof(float) * K * chunk * P);
  for (int64_t first = 0; first < g.batch; first += chunk) {
    const int64_t count = std::min(chunk, g.batch - first), n = count * P;
    // [count, O, P] -> [O, count*P], the layout the GEMMs want (through ReLU's mask if fused).
    float* gy = gy_storage.as<float>();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < count; ++b)
      for (int64_t o = 0; o < O; ++o) {
        const int64_t at = ((first + b) * O + o) * P;
        float* to = gy + o * n + b * P;
        if (g.fuse_relu) {
          for (int64_t p = 0; p < P; ++p) to[p] = y[at + p] > 0.0f ? go[at + p] : 0.0f;
        } else {
          std::memcpy(to, go + at, sizeof(float) * P);
        }
      }
    auto gy_mat = mat(static_cast<const float*>(gy), O, n);
    if (gbias) Eigen::Map<Eigen::VectorXf>(gbias, O) += gy_mat.rowwise().sum();
    if (gw) {
      im2col(g, x, first, count, cols.as<float>());
      mat(gw, O, K).noalias() += gy_mat * mat(static_cast<const float*>(cols.as<float>()), K, n).transpose();
    }
    if (gx) {
      mat(gcols->as<float>(), K, n).noalias() = mat(w, O, K).transpose() * gy_mat;
      col2im_add(g, gcols->as<float>(), first, count, gx);
    }
  }
}

}  // namespace dptrain::cpu
