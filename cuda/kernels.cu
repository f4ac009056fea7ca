// The CUDA backend's kernels: grid-stride loops, one launch per call, nothing waits for the host.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/activation_rules.h"
#include "core/half.h"
#include "core/rng.h"
#include "core/update_rules.h"
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace dptrain::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  // Enough blocks to fill an H100 (132 SMs) several times over; the grid-stride loop covers the rest.
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 132 * 32));
}

__device__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t grid_stride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

// Kernels that divide an element's index into coordinates do it in 32 bits whenever the tensor
// allows (64-bit division costs several times more), selected by DPTRAIN_LAUNCH_INDEXED.
bool fits_32_bits(int64_t n) {
  return n <= std::numeric_limits<int32_t>::max() - static_cast<int64_t>(132) * 32 * kThreads;
}

#define DPTRAIN_LAUNCH(kernel, n, stream, ...)                       \
  do {                                                               \
    if ((n) > 0) {                                                   \
      kernel<<<blocks_for(n), kThreads, 0, (stream)>>>(__VA_ARGS__); \
      DPTRAIN_CUDA_CHECK_LAUNCH(#kernel);                            \
    }                                                                \
  } while (0)

#define DPTRAIN_LAUNCH_INDEXED(kernel, n, stream, ...)                          \
  do {                                                                          \
    if ((n) > 0) {                                                              \
      if (fits_32_bits(n))                                                      \
        kernel<int32_t><<<blocks_for(n), kThreads, 0, (stream)>>>(__VA_ARGS__); \
      else                                                                      \
        kernel<int64_t><<<blocks_for(n), kThreads, 0, (stream)>>>(__VA_ARGS__); \
      DPTRAIN_CUDA_CHECK_LAUNCH(#kernel);                                       \
    }                                                                           \
  } while (0)

__global__ void fill_kernel(float* y, int64_t n, float value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = value;
}
__global__ void add_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += x[i];
}
__global__ void add_scalar_kernel(float* y, int64_t n, float value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += value;
}
__global__ void add_device_scalar_kernel(const float* value, float* y, int64_t n) {
  const float v = value[0];
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += v;
}

// x and y may be the same buffer (an epilogue in place); no bias: only the ReLU.
template <typename Index>
__global__ void add_bias_kernel(const float* x, const float* __restrict__ bias, float* y, BiasShape s,
                                bool relu) {
  const Index n = static_cast<Index>(s.outer * s.channels * s.inner), inner = static_cast<Index>(s.inner),
              channels = static_cast<Index>(s.channels);
  for (Index i = static_cast<Index>(first_index()); i < n; i += static_cast<Index>(grid_stride())) {
    const float v = bias ? x[i] + bias[(i / inner) % channels] : x[i];
    y[i] = relu ? relu_of(v) : v;
  }
}

// Column sums of a [rows, columns] matrix (a linear layer's bias gradient): a block covers 32
// columns, its 8 warps take every 8th row, so each warp reads 32 neighbouring floats at a time;
// the 8 partial sums are added in a fixed order.
constexpr int kColumnRowsInFlight = kThreads / 32;
__global__ void column_sums_kernel(const float* __restrict__ gy, float* __restrict__ gbias, int64_t rows,
                                   int64_t columns) {
  __shared__ float partial[kColumnRowsInFlight][32];
  const int lane = threadIdx.x % 32, row_group = threadIdx.x / 32;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float acc = 0.0f;
  if (column < columns)
    for (int64_t r = row_group; r < rows; r += kColumnRowsInFlight) acc += gy[r * columns + column];
  partial[row_group][lane] = acc;
  __syncthreads();
  if (row_group == 0 && column < columns) {
    float total = 0.0f;
    for (int g = 0; g < kColumnRowsInFlight; ++g) total += partial[g][lane];
    gbias[column] += total;
  }
}

__global__ void add_doubles_kernel(const double* __restrict__ sums, float* __restrict__ y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += static_cast<float>(sums[i]);
}

__global__ void relu_mask_kernel(const float* __restrict__ gy, const float* __restrict__ y,
                                 float* __restrict__ out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = y[i] > 0.0f ? gy[i] : 0.0f;
}

// One thread per output: the first maximum in row-major window order over the positions inside
// the plane (padding takes no part, as PyTorch's -inf); a NaN beats everything.
__global__ void maxpool_kernel(const float* __restrict__ x, float* __restrict__ y,
                               int32_t* __restrict__ argmax, Pool2dGeometry g) {
  const int64_t out_plane = g.out_h * g.out_w, n = g.planes * out_plane;
  for (int64_t o = first_index(); o < n; o += grid_stride()) {
    const int64_t p = o / out_plane, i = (o % out_plane) / g.out_w, j = o % g.out_w;
    const float* plane = x + p * g.height * g.width;
    const int64_t top = i * g.stride - g.padding, left = j * g.stride - g.padding;
    int64_t best = -1;
    float best_value = -INFINITY;
    for (int64_t r = max(top, int64_t{0}); r < min(top + g.kernel, g.height); ++r)
      for (int64_t c = max(left, int64_t{0}); c < min(left + g.kernel, g.width); ++c) {
        const int64_t at = r * g.width + c;
        const float v = plane[at];
        if (best < 0 || v > best_value || v != v) {
          best_value = v;
          best = at;
        }
      }
    y[o] = best_value;
    if (argmax) argmax[o] = static_cast<int32_t>(best);
  }
}

// won(o) for every output o whose window covers input element idx and chose it, in output
// (row-major) order: the gather behind max-pooling's backward, one thread per input element.
template <typename Won>
__device__ void for_each_window_won(const int32_t* __restrict__ argmax, const Pool2dGeometry& g, int64_t idx,
                                    Won won) {
  const int64_t in_plane = g.height * g.width, out_plane = g.out_h * g.out_w;
  const int64_t p = idx / in_plane, local = idx % in_plane;
  // In padded coordinates: output rows oh with oh * stride <= ih + padding < oh * stride + kernel.
  const int64_t ih = local / g.width + g.padding, iw = local % g.width + g.padding;
  const int64_t oh_first = ih >= g.kernel ? (ih - g.kernel) / g.stride + 1 : 0;
  const int64_t oh_last = min(ih / g.stride, g.out_h - 1);
  const int64_t ow_first = iw >= g.kernel ? (iw - g.kernel) / g.stride + 1 : 0;
  const int64_t ow_last = min(iw / g.stride, g.out_w - 1);
  for (int64_t oh = oh_first; oh <= oh_last; ++oh)
    for (int64_t ow = ow_first; ow <= ow_last; ++ow) {
      const int64_t o = p * out_plane + oh * g.out_w + ow;
      if (argmax[o] == local) won(o);
    }
}

__global__ void maxpool_backward_kernel(const float* __restrict__ gy, const int32_t* __restrict__ argmax,
                                        float* __restrict__ gx, Pool2dGeometry g) {
  const int64_t n = g.planes * g.height * g.width;
  for (int64_t idx = first_index(); idx < n; idx += grid_stride()) {
    float acc = gx[idx];
    for_each_window_won(argmax, g, idx, [&](int64_t o) { acc += gy[o]; });
    gx[idx] = acc;
  }
}

// maxpool_backward_kernel twice over (gy and the pooled y, each from 0) and ReLU's mask, written.
__global__ void maxpool_relu_backward_kernel(const float* __restrict__ gy, const int32_t* __restrict__ argmax,
                                             const float* __restrict__ y, float* __restrict__ gconv,
                                             Pool2dGeometry g) {
  const int64_t n = g.planes * g.height * g.width;
  for (int64_t idx = first_index(); idx < n; idx += grid_stride()) {
    float gradient = 0.0f, pooled = 0.0f;
    for_each_window_won(argmax, g, idx, [&](int64_t o) {
      gradient += gy[o];
      pooled += y[o];
    });
    gconv[idx] = pooled > 0.0f ? gradient : 0.0f;
  }
}

// Sums a double per thread over a block of kThreads in shared memory; thread 0 gets the total.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // the buffer may be reused by the caller's next sum
  return total;
}

// Batch normalisation's per-channel reductions: block (k, c) sums channel c over the samples of
// split k, in double, threads striding over (sample, position) in a fixed order; a second kernel adds
// each channel's splits in order. Deterministic for a given shape.
struct SplitRange {
  int64_t first_sample, samples;
};
__device__ SplitRange split_of(BatchNormShape s, int splits) {
  const int64_t k = blockIdx.x, per = (s.batch + splits - 1) / splits, first = k * per;
  return {first, max(int64_t{0}, min(per, s.batch - first))};
}
// Visits the split's elements of channel c (indices `at` into [batch, C, inner]) in a fixed order per
// thread, j = threadIdx.x, + blockDim.x, ...: load(at) for four of them at once, so that four loads
// are in flight (one at a time left the reductions at a fraction of the memory's bandwidth), then
// add(value) for each in that order. The sums are those of adding one element at a time.
template <typename Load, typename Add>
__device__ void visit_split(BatchNormShape s, int64_t c, SplitRange r, Load load, Add add) {
  constexpr int kInFlight = 4;
  const auto element = [&](auto j, auto inner) {
    return ((r.first_sample + static_cast<int64_t>(j / inner)) * s.channels + c) * s.inner +
           static_cast<int64_t>(j % inner);
  };
  const auto visit = [&](auto count, auto inner) {
    using Index = decltype(count);
    const Index stride = blockDim.x;
    Index j = threadIdx.x;
    for (; j + (kInFlight - 1) * stride < count; j += kInFlight * stride) {
      decltype(load(int64_t{0})) values[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) values[u] = load(element(j + u * stride, inner));
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) add(values[u]);
    }
    for (; j < count; j += stride) add(load(element(j, inner)));
  };
  const int64_t count = r.samples * s.inner;
  if (count <= int64_t{0x7fffffff})  // 32-bit division: the common case
    visit(static_cast<uint32_t>(count), static_cast<uint32_t>(s.inner));
  else
    visit(count, s.inner);
}

__global__ void batchnorm_partial_sums_kernel(const float* __restrict__ x, double* __restrict__ partials,
                                              BatchNormShape s, int splits) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.y;
  double acc = 0;
  visit_split(
      s, c, split_of(s, splits), [&](int64_t at) { return x[at]; },
      [&](float v) { acc += static_cast<double>(v); });
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[c * splits + blockIdx.x] = total;
}

__global__ void batchnorm_partial_squares_kernel(const float* __restrict__ x, const double* __restrict__ sums,
                                                 double* __restrict__ partials, BatchNormShape s,
                                                 int splits) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.y;
  const auto mean = static_cast<float>(sums[c] / sums[s.channels]);  // the mean normalisation uses
  double acc = 0;
  visit_split(
      s, c, split_of(s, splits), [&](int64_t at) { return x[at]; },
      [&](float v) {
        const float d = v - mean;
        acc += static_cast<double>(d * d);
      });
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[c * splits + blockIdx.x] = total;
}

// out[c] = the sum of channel c's splits, in order; with `count`, out[channels] = count as well.
__global__ void add_splits_kernel(const double* __restrict__ partials, double* __restrict__ out,
                                  int64_t channels, int splits, double count) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    double total = 0;
    for (int k = 0; k < splits; ++k) total += partials[c * splits + k];
    out[c] = total;
  }
  if (count >= 0 && first_index() == 0) out[channels] = count;
}

// The normalisation's gradient at element i: gy, or through the epilogue's ReLU when relu_y is set.
__device__ float normalized_gradient(const float* __restrict__ gy, const float* __restrict__ relu_y,
                                     int64_t i) {
  return relu_y ? relu_gradient(gy[i], relu_y[i]) : gy[i];
}

// Both sums in one pass over gy and x (two passes read gy twice), and on the way, with gresidual,
// the residual's gradient g (a pass of its own would read gy and y again); written as 0 + g, the
// bits of adding into zeros, where overwrite_residual says the buffer is new.
__global__ void batchnorm_partial_backward_kernel(
    const float* __restrict__ gy, const float* __restrict__ relu_y, const float* __restrict__ x,
    const float* __restrict__ stats, float* __restrict__ gresidual, bool overwrite_residual,
    double* __restrict__ partials, BatchNormShape s, int splits) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.y;
  const float mean = stats[c];
  struct GradientAndInput {
    float g, x;
  };
  double sum_gy = 0, sum_gy_xmu = 0;
  visit_split(
      s, c, split_of(s, splits),
      [&](int64_t at) {
        const float g = normalized_gradient(gy, relu_y, at);
        if (gresidual) gresidual[at] = (overwrite_residual ? 0.0f : gresidual[at]) + g;
        return GradientAndInput{g, x[at]};
      },
      [&](GradientAndInput v) {
        sum_gy += static_cast<double>(v.g);
        sum_gy_xmu += static_cast<double>(v.g * (v.x - mean));
      });
  sum_gy = block_sum(sum_gy, shared);
  sum_gy_xmu = block_sum(sum_gy_xmu, shared);
  if (threadIdx.x == 0) {
    partials[c * splits + blockIdx.x] = sum_gy;
    partials[(s.channels + c) * splits + blockIdx.x] = sum_gy_xmu;
  }
}

__global__ void batchnorm_finish_backward_kernel(const double* __restrict__ partials,
                                                 const float* __restrict__ stats,
                                                 double* __restrict__ grad_sums, float* __restrict__ ggamma,
                                                 float* __restrict__ gbeta, int64_t channels, int splits) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    double sum_gy = 0, sum_gy_xmu = 0;
    for (int k = 0; k < splits; ++k) {
      sum_gy += partials[c * splits + k];
      sum_gy_xmu += partials[(channels + c) * splits + k];
    }
    grad_sums[c] = sum_gy;
    grad_sums[channels + c] = sum_gy_xmu;
    if (ggamma) ggamma[c] += static_cast<float>(sum_gy_xmu * stats[channels + c]);
    if (gbeta) gbeta[c] += static_cast<float>(sum_gy);
  }
}

__global__ void batchnorm_batch_stats_kernel(const double* __restrict__ sums,
                                             const double* __restrict__ squares, float* __restrict__ stats,
                                             float* __restrict__ running_mean,
                                             float* __restrict__ running_var, int64_t channels, float eps,
                                             float momentum) {
  const double count = sums[channels];
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const double mean = sums[c] / count, var = squares[c] / count;
    stats[c] = static_cast<float>(mean);
    stats[channels + c] = static_cast<float>(1.0 / sqrt(var + eps));
    if (running_mean) {
      const double unbiased = count > 1 ? squares[c] / (count - 1) : var;
      running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

__global__ void batchnorm_running_stats_kernel(const float* __restrict__ running_mean,
                                               const float* __restrict__ running_var,
                                               float* __restrict__ stats, int64_t channels, float eps) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    stats[c] = running_mean[c];
    stats[channels + c] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[c]) + eps));
  }
}

template <typename Index>
__global__ void batchnorm_normalize_kernel(const float* __restrict__ x, const float* __restrict__ stats,
                                           const float* __restrict__ gamma, const float* __restrict__ beta,
                                           const float* __restrict__ residual, bool relu,
                                           float* __restrict__ y, BatchNormShape s) {
  const Index n = static_cast<Index>(s.batch * s.channels * s.inner), inner = static_cast<Index>(s.inner),
              channels = static_cast<Index>(s.channels);
  for (Index i = static_cast<Index>(first_index()); i < n; i += static_cast<Index>(grid_stride())) {
    const Index c = (i / inner) % channels;
    const float scale = stats[s.channels + c] * gamma[c], shift = beta[c] - stats[c] * scale;
    float v = x[i] * scale + shift;
    if (residual) v += residual[i];
    y[i] = relu ? relu_of(v) : v;
  }
}

// grad_sums null: fixed statistics (evaluation), gx += gamma invstd gy.
template <typename Index>
__global__ void batchnorm_backward_input_kernel(
    const float* __restrict__ gy, const float* __restrict__ relu_y, const float* __restrict__ x,
    const float* __restrict__ stats, const float* __restrict__ gamma, const double* __restrict__ grad_sums,
    const double* __restrict__ sums, float* __restrict__ gx, bool overwrite, BatchNormShape s) {
  const Index n = static_cast<Index>(s.batch * s.channels * s.inner), inner = static_cast<Index>(s.inner),
              channels = static_cast<Index>(s.channels);
  for (Index i = static_cast<Index>(first_index()); i < n; i += static_cast<Index>(grid_stride())) {
    const Index c = (i / inner) % channels;
    const float mean = stats[c], invstd = stats[s.channels + c], scale = gamma[c] * invstd;
    const float g = normalized_gradient(gy, relu_y, static_cast<int64_t>(i));
    const float held = overwrite ? 0.0f : gx[i];  // 0 + v when written: the bits of adding into zeros
    if (grad_sums == nullptr) {
      gx[i] = held + scale * g;
      continue;
    }
    const double count = sums[s.channels];
    const auto mean_gy = static_cast<float>(grad_sums[c] / count);
    const auto mean_gy_xmu = static_cast<float>(grad_sums[s.channels + c] / count);
    const float slope = -scale * invstd * invstd * mean_gy_xmu;
    const float offset = -scale * mean_gy - slope * mean;
    gx[i] = held + (g * scale + x[i] * slope + offset);
  }
}

// One warp per plane (global average pooling's planes are small: 7x7 to 8x8), double accumulation.
__global__ void mean_planes_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t planes,
                                   int64_t plane_size) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t p = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; p < planes;
       p += warps) {
    double acc = 0;
    for (int64_t i = lane; i < plane_size; i += 32) acc += x[p * plane_size + i];
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) y[p] = static_cast<float>(acc / static_cast<double>(plane_size));
  }
}

template <typename Index>
__global__ void mean_planes_backward_kernel(const float* __restrict__ gy, float* __restrict__ gx,
                                            int64_t planes, int64_t plane_size) {
  const Index n = static_cast<Index>(planes * plane_size), size = static_cast<Index>(plane_size);
  for (Index i = static_cast<Index>(first_index()); i < n; i += static_cast<Index>(grid_stride()))
    gx[i] += gy[i / size] / static_cast<float>(plane_size);
}

__device__ float activate(Activation f, float v) {
  switch (f) {
    case Activation::kRelu:
      return relu_of(v);
    case Activation::kTanh:
      return tanhf(v);
    case Activation::kSigmoid:
      return 1.0f / (1.0f + expf(-v));
  }
  return v;
}

__device__ float derivative(Activation f, float x, float y) {
  switch (f) {
    case Activation::kRelu:
      return x > 0.0f ? 1.0f : 0.0f;
    case Activation::kTanh:
      return 1.0f - y * y;
    case Activation::kSigmoid:
      return y * (1.0f - y);
  }
  return 1.0f;
}

__global__ void activation_kernel(Activation f, const float* __restrict__ x, float* __restrict__ y,
                                  int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = activate(f, x[i]);
}
__global__ void activation_backward_kernel(Activation f, const float* __restrict__ x,
                                           const float* __restrict__ y, const float* __restrict__ gy,
                                           float* __restrict__ gx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) gx[i] += gy[i] * derivative(f, x[i], y[i]);
}

__global__ void dropout_kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ mask,
                               int64_t n, float p, uint64_t state) {
  const float keep_scale = 1.0f / (1.0f - p);
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float m =
        uniform_from_bits(splitmix64_draw(state, static_cast<uint64_t>(i))) >= p ? keep_scale : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}
__global__ void dropout_backward_kernel(const float* __restrict__ gy, const float* __restrict__ mask,
                                        float* __restrict__ gx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) gx[i] += gy[i] * mask[i];
}

// One warp per row: the maximum, the sum of exponentials, then the probabilities and the row's loss.
__global__ void softmax_cross_entropy_kernel(const float* __restrict__ logits,
                                             const int32_t* __restrict__ labels, float* __restrict__ probs,
                                             float* __restrict__ row_loss, int64_t batch, int64_t classes) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; b < batch;
       b += warps) {
    const float* row = logits + b * classes;
    float peak = -INFINITY;
    for (int64_t c = lane; c < classes; c += 32) peak = fmaxf(peak, row[c]);
    for (int offset = 16; offset > 0; offset /= 2)
      peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, offset));
    float denom = 0.0f;
    float* out = probs + b * classes;
    for (int64_t c = lane; c < classes; c += 32) {
      const float e = expf(row[c] - peak);
      out[c] = e;  // read back below by this same lane
      denom += e;
    }
    for (int offset = 16; offset > 0; offset /= 2) denom += __shfl_xor_sync(0xffffffffu, denom, offset);
    for (int64_t c = lane; c < classes; c += 32) out[c] /= denom;
    if (lane == 0) row_loss[b] = logf(denom) - (row[labels[b]] - peak);
  }
}

template <typename Index>
__global__ void cross_entropy_backward_kernel(const float* __restrict__ probs,
                                              const int32_t* __restrict__ labels,
                                              const float* __restrict__ gloss, float* __restrict__ g,
                                              int64_t batch, int64_t classes) {
  const float scale = gloss[0] / static_cast<float>(batch);
  const Index n = static_cast<Index>(batch * classes), k = static_cast<Index>(classes);
  for (Index i = static_cast<Index>(first_index()); i < n; i += static_cast<Index>(grid_stride())) {
    const Index b = i / k, c = i % k;
    g[i] += scale * (probs[i] - (c == labels[b] ? 1.0f : 0.0f));
  }
}

__global__ void mse_backward_kernel(const float* __restrict__ p, const float* __restrict__ t,
                                    const float* __restrict__ gloss, float* __restrict__ g, int64_t n) {
  const float scale = 2.0f * gloss[0] / static_cast<float>(n);
  for (int64_t i = first_index(); i < n; i += grid_stride()) g[i] += scale * (p[i] - t[i]);
}

// Block partials of sum(x), sum(x^2) or sum((x - t)^2) in double, a tree in shared memory per block.
__global__ void partial_sums_kernel(const float* __restrict__ x, const float* __restrict__ t, int64_t n,
                                    bool square, double* __restrict__ partials) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double v = t ? static_cast<double>(x[i]) - t[i] : x[i];
    acc += t || square ? v * v : v;
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

__global__ void final_sum_kernel(const double* __restrict__ partials, int count, double scale,
                                 float* __restrict__ out) {
  __shared__ double shared[kReductionBlocks];
  for (int i = threadIdx.x; i < kReductionBlocks; i += blockDim.x) shared[i] = i < count ? partials[i] : 0.0;
  __syncthreads();
  for (int half = kReductionBlocks / 2; half > 0; half /= 2) {
    for (int i = threadIdx.x; i < half; i += blockDim.x) shared[i] += shared[i + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(shared[0] * scale);
}

__global__ void flag_non_finite_kernel(const float* __restrict__ x, int64_t n, int32_t* flag) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    if (!isfinite(x[i])) *flag = 1;  // every writer stores the same value: the race is benign
}

// The first marker wins (a compare-and-swap from 0): the flag keeps the first step that failed.
__global__ void mark_non_finite_kernel(const float* __restrict__ x, int64_t n, int32_t* flag, int32_t value) {
  if (*flag != 0) return;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    if (!isfinite(x[i])) {
      atomicCAS(flag, 0, value);
      return;
    }
}

// One thread per row, scanning in order: std::max_element's first largest, NaN rules included.
__global__ void count_correct_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels,
                                     int64_t batch, int64_t classes, float* __restrict__ out) {
  __shared__ int counts[kThreads];
  int count = 0;
  for (int64_t b = threadIdx.x; b < batch; b += blockDim.x) {
    const float* row = logits + b * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (row[best] < row[c]) best = c;
    count += best == labels[b];
  }
  counts[threadIdx.x] = count;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) counts[threadIdx.x] += counts[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(counts[0]);
}

__global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                           float* __restrict__ momentum_buffer, int64_t n, SgdStep s) {
  if (s.skip_if_set != nullptr && *s.skip_if_set != 0) return;
  float unused = 0.0f;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    sgd_update(params[i], grads[i], momentum_buffer ? momentum_buffer[i] : unused, s);
}

__global__ void adam_kernel(float* __restrict__ params, const float* __restrict__ grads,
                            float* __restrict__ m, float* __restrict__ v, int64_t n, AdamStep s) {
  if (s.skip_if_set != nullptr && *s.skip_if_set != 0) return;
  for (int64_t i = first_index(); i < n; i += grid_stride()) adam_update(params[i], grads[i], m[i], v[i], s);
}

// The CPU's conversions (core/half.h), bit for bit: CUDA's own intrinsics make other NaN payloads.
__global__ void to_half_kernel(const float* __restrict__ src, uint16_t* __restrict__ dst, int64_t n,
                               float scale, bool fp16) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = fp16 ? float_to_half_portable(src[i] * scale) : float_to_bfloat16(src[i] * scale);
}
__global__ void from_half_kernel(const uint16_t* __restrict__ src, float* __restrict__ dst, int64_t n,
                                 bool fp16) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = fp16 ? half_to_float_portable(src[i]) : bfloat16_to_float(src[i]);
}

}  // namespace

void fill(float* y, int64_t n, float value, cudaStream_t stream) {
  // Zeroing is most fills (every gradient buffer: about 5.7 GB a step for resnet50 at batch 64), and
  // +0.0f is all zero bytes: the driver's memset, tuned per device, rather than 4-byte stores.
  if (value == 0.0f && !std::signbit(value)) {
    if (n > 0) DPTRAIN_CUDA_CHECK(cudaMemsetAsync(y, 0, sizeof(float) * static_cast<std::size_t>(n), stream));
    return;
  }
  DPTRAIN_LAUNCH(fill_kernel, n, stream, y, n, value);
}
void add(const float* x, float* y, int64_t n, cudaStream_t stream) {
  DPTRAIN_LAUNCH(add_kernel, n, stream, x, y, n);
}
void add_scalar(float* y, int64_t n, float value, cudaStream_t stream) {
  DPTRAIN_LAUNCH(add_scalar_kernel, n, stream, y, n, value);
}
void add_device_scalar(const float* value, float* y, int64_t n, cudaStream_t stream) {
  DPTRAIN_LAUNCH(add_device_scalar_kernel, n, stream, value, y, n);
}

void add_bias(const float* x, const float* bias, float* y, BiasShape s, bool relu, cudaStream_t stream) {
  DPTRAIN_LAUNCH_INDEXED(add_bias_kernel, s.outer * s.channels * s.inner, stream, x, bias, y, s, relu);
}

void bias_gradient(const float* gy, float* gbias, BiasShape s, double* partials, cudaStream_t stream) {
  if (s.channels == 0 || s.outer == 0 || s.inner == 0) return;
  if (s.inner == 1) {
    const auto blocks = static_cast<unsigned>((s.channels + 31) / 32);
    column_sums_kernel<<<blocks, kThreads, 0, stream>>>(gy, gbias, s.outer, s.channels);
    DPTRAIN_CUDA_CHECK_LAUNCH("column_sums_kernel");
    return;
  }
  // A convolution's: the channel sums of batch normalisation, then added to gbias.
  const BatchNormShape shape{s.outer, s.channels, s.inner};
  double* sums = partials + batchnorm_partials(shape);
  batchnorm_sums(gy, sums, shape, partials, stream);
  DPTRAIN_LAUNCH(add_doubles_kernel, s.channels, stream, sums, gbias, s.channels);
}

void relu_mask(const float* gy, const float* y, float* masked, int64_t n, cudaStream_t stream) {
  DPTRAIN_LAUNCH(relu_mask_kernel, n, stream, gy, y, masked, n);
}

void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g, cudaStream_t stream) {
  DPTRAIN_LAUNCH(maxpool_kernel, g.planes * g.out_h * g.out_w, stream, x, y, argmax, g);
}

void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx, const Pool2dGeometry& g,
                        cudaStream_t stream) {
  DPTRAIN_LAUNCH(maxpool_backward_kernel, g.planes * g.height * g.width, stream, gy, argmax, gx, g);
}

void maxpool_relu_backward(const float* gy, const int32_t* argmax, const float* y, float* gconv,
                           const Pool2dGeometry& g, cudaStream_t stream) {
  DPTRAIN_LAUNCH(maxpool_relu_backward_kernel, g.planes * g.height * g.width, stream, gy, argmax, y, gconv,
                 g);
}

namespace {
// Blocks per channel: about four waves of blocks on an H100's 132 SMs, at most one per sample.
int batchnorm_splits(BatchNormShape s) {
  const int64_t wanted = (4 * 132 + s.channels - 1) / std::max<int64_t>(s.channels, 1);
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, std::max<int64_t>(s.batch, 1)));
}
dim3 batchnorm_grid(BatchNormShape s) {
  DPTRAIN_CHECK(s.channels <= 65535, "per-channel sums over ", s.channels,
                " channels: the CUDA backend takes at most 65535 (a grid dimension)");
  return dim3(static_cast<unsigned>(batchnorm_splits(s)), static_cast<unsigned>(s.channels));
}
}  // namespace

int64_t batchnorm_partials(BatchNormShape s) {
  return 2 * s.channels * batchnorm_splits(s);
}

int64_t bias_gradient_partials(BiasShape s) {
  return s.inner == 1 ? 0 : batchnorm_partials({s.outer, s.channels, s.inner}) + s.channels + 1;
}

void batchnorm_sums(const float* x, double* sums, BatchNormShape s, double* partials, cudaStream_t stream) {
  if (s.channels == 0) return;
  const int splits = batchnorm_splits(s);
  batchnorm_partial_sums_kernel<<<batchnorm_grid(s), kThreads, 0, stream>>>(x, partials, s, splits);
  DPTRAIN_CUDA_CHECK_LAUNCH("batchnorm_partial_sums_kernel");
  DPTRAIN_LAUNCH(add_splits_kernel, s.channels, stream, partials, sums, s.channels, splits,
                 static_cast<double>(s.batch * s.inner));
}

void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s,
                       double* partials, cudaStream_t stream) {
  if (s.channels == 0) return;
  const int splits = batchnorm_splits(s);
  batchnorm_partial_squares_kernel<<<batchnorm_grid(s), kThreads, 0, stream>>>(x, sums, partials, s, splits);
  DPTRAIN_CUDA_CHECK_LAUNCH("batchnorm_partial_squares_kernel");
  DPTRAIN_LAUNCH(add_splits_kernel, s.channels, stream, partials, squares, s.channels, splits, -1.0);
}

void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                           float* running_var, int64_t channels, float eps, float momentum,
                           cudaStream_t stream) {
  DPTRAIN_LAUNCH(batchnorm_batch_stats_kernel, channels, stream, sums, squares, stats, running_mean,
                 running_var, channels, eps, momentum);
}

void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                             int64_t channels, float eps, cudaStream_t stream) {
  DPTRAIN_LAUNCH(batchnorm_running_stats_kernel, channels, stream, running_mean, running_var, stats, channels,
                 eps);
}

void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta, float* y,
                         BatchNormShape s, BatchNormEpilogue epilogue, cudaStream_t stream) {
  DPTRAIN_LAUNCH_INDEXED(batchnorm_normalize_kernel, s.batch * s.channels * s.inner, stream, x, stats, gamma,
                         beta, epilogue.residual, epilogue.relu, y, s);
}

void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                               double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                               BatchNormShape s, double* partials, cudaStream_t stream) {
  if (s.channels == 0) return;
  const int splits = batchnorm_splits(s);
  batchnorm_partial_backward_kernel<<<batchnorm_grid(s), kThreads, 0, stream>>>(
      gy, relu_y, x, stats, gresidual.data, gresidual.overwrite, partials, s, splits);
  DPTRAIN_CUDA_CHECK_LAUNCH("batchnorm_partial_backward_kernel");
  DPTRAIN_LAUNCH(batchnorm_finish_backward_kernel, s.channels, stream, partials, stats, grad_sums, ggamma,
                 gbeta, s.channels, splits);
}

void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                              const float* gamma, const double* grad_sums, const double* sums, GradientOut gx,
                              BatchNormShape s, cudaStream_t stream) {
  DPTRAIN_LAUNCH_INDEXED(batchnorm_backward_input_kernel, s.batch * s.channels * s.inner, stream, gy, relu_y,
                         x, stats, gamma, grad_sums, sums, gx.data, gx.overwrite, s);
}

void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size, cudaStream_t stream) {
  if (planes == 0) return;
  const int64_t warps_per_block = kThreads / 32;
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((planes + warps_per_block - 1) / warps_per_block, 1, 132 * 32));
  mean_planes_kernel<<<blocks, kThreads, 0, stream>>>(x, y, planes, plane_size);
  DPTRAIN_CUDA_CHECK_LAUNCH("mean_planes_kernel");
}

void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size,
                          cudaStream_t stream) {
  DPTRAIN_LAUNCH_INDEXED(mean_planes_backward_kernel, planes * plane_size, stream, gy, gx, planes,
                         plane_size);
}

void activation(Activation f, const float* x, float* y, int64_t n, cudaStream_t stream) {
  DPTRAIN_LAUNCH(activation_kernel, n, stream, f, x, y, n);
}

void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx, int64_t n,
                         cudaStream_t stream) {
  DPTRAIN_LAUNCH(activation_backward_kernel, n, stream, f, x, y, gy, gx, n);
}

void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state,
             cudaStream_t stream) {
  DPTRAIN_LAUNCH(dropout_kernel, n, stream, x, y, mask, n, p, rng_state);
}

void dropout_backward(const float* gy, const float* mask, float* gx, int64_t n, cudaStream_t stream) {
  DPTRAIN_LAUNCH(dropout_backward_kernel, n, stream, gy, mask, gx, n);
}

void softmax_cross_entropy(const float* logits, const int32_t* labels, float* probs, float* row_loss,
                           int64_t batch, int64_t classes, cudaStream_t stream) {
  if (batch == 0) return;
  const int64_t warps_per_block = kThreads / 32;
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((batch + warps_per_block - 1) / warps_per_block, 1, 132 * 32));
  softmax_cross_entropy_kernel<<<blocks, kThreads, 0, stream>>>(logits, labels, probs, row_loss, batch,
                                                                classes);
  DPTRAIN_CUDA_CHECK_LAUNCH("softmax_cross_entropy_kernel");
}

void cross_entropy_backward(const float* probs, const int32_t* labels, const float* gloss, float* glogits,
                            int64_t batch, int64_t classes, cudaStream_t stream) {
  DPTRAIN_LAUNCH_INDEXED(cross_entropy_backward_kernel, batch * classes, stream, probs, labels, gloss,
                         glogits, batch, classes);
}

void mse_backward(const float* prediction, const float* target, const float* gloss, float* gprediction,
                  int64_t n, cudaStream_t stream) {
  DPTRAIN_LAUNCH(mse_backward_kernel, n, stream, prediction, target, gloss, gprediction, n);
}

void reduce_sum(const float* x, const float* t, int64_t n, double scale, double* partials, float* out,
                cudaStream_t stream) {
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kReductionBlocks));
  partial_sums_kernel<<<blocks, kThreads, 0, stream>>>(x, t, n, /*square=*/false, partials);
  DPTRAIN_CUDA_CHECK_LAUNCH("partial_sums_kernel");
  final_sum_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, scale, out);
  DPTRAIN_CUDA_CHECK_LAUNCH("final_sum_kernel");
}

int sum_of_squares_partials(const float* x, int64_t n, double* partials, cudaStream_t stream) {
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kReductionBlocks));
  partial_sums_kernel<<<blocks, kThreads, 0, stream>>>(x, nullptr, n, /*square=*/true, partials);
  DPTRAIN_CUDA_CHECK_LAUNCH("partial_sums_kernel");
  return blocks;
}

void flag_non_finite(const float* x, int64_t n, int32_t* flag, cudaStream_t stream) {
  DPTRAIN_LAUNCH(flag_non_finite_kernel, n, stream, x, n, flag);
}

void mark_non_finite(const float* x, int64_t n, int32_t* flag, int32_t value, cudaStream_t stream) {
  DPTRAIN_LAUNCH(mark_non_finite_kernel, n, stream, x, n, flag, value);
}

void count_correct(const float* logits, const int32_t* labels, int64_t batch, int64_t classes, float* out,
                   cudaStream_t stream) {
  count_correct_kernel<<<1, kThreads, 0, stream>>>(logits, labels, batch, classes, out);
  DPTRAIN_CUDA_CHECK_LAUNCH("count_correct_kernel");
}

void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n, const SgdStep& s,
              cudaStream_t stream) {
  DPTRAIN_LAUNCH(sgd_kernel, n, stream, params, grads, momentum_buffer, n, s);
}

void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamStep& s, cudaStream_t stream) {
  DPTRAIN_LAUNCH(adam_kernel, n, stream, params, grads, exp_avg, exp_avg_sq, n, s);
}

void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format,
                      cudaStream_t stream) {
  DPTRAIN_LAUNCH(to_half_kernel, n, stream, src, dst, n, scale, format == HalfFormat::kFp16);
}

void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format, cudaStream_t stream) {
  DPTRAIN_LAUNCH(from_half_kernel, n, stream, src, dst, n, format == HalfFormat::kFp16);
}

}  // namespace dptrain::cuda
