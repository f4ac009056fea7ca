// The CUDA backend's kernels: grid-stride loops, one launch per call, nothing waits for the host.
#include <algorithm>
#include <cmath>

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

#define DPTRAIN_LAUNCH(kernel, n, stream, ...)                       \
  do {                                                               \
    if ((n) > 0) {                                                   \
      kernel<<<blocks_for(n), kThreads, 0, (stream)>>>(__VA_ARGS__); \
      DPTRAIN_CUDA_CHECK_LAUNCH();                                   \
    }                                                                \
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
__global__ void add_bias_kernel(const float* x, const float* __restrict__ bias, float* y, BiasShape s,
                                bool relu) {
  const int64_t n = s.outer * s.channels * s.inner;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = bias ? x[i] + bias[(i / s.inner) % s.channels] : x[i];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

// One block per channel; threads stride over (outer, inner), then a tree in shared memory.
__global__ void bias_gradient_kernel(const float* __restrict__ gy, float* __restrict__ gbias, BiasShape s) {
  __shared__ float partial[kThreads];
  const int64_t c = blockIdx.x, count = s.outer * s.inner;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t o = j / s.inner, i = j % s.inner;
    acc += gy[(o * s.channels + c) * s.inner + i];
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) gbias[c] += partial[0];
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

// One thread per input element: the outputs whose windows cover it, in output (row-major) order.
__global__ void maxpool_backward_kernel(const float* __restrict__ gy, const int32_t* __restrict__ argmax,
                                        float* __restrict__ gx, Pool2dGeometry g) {
  const int64_t in_plane = g.height * g.width, out_plane = g.out_h * g.out_w, n = g.planes * in_plane;
  for (int64_t idx = first_index(); idx < n; idx += grid_stride()) {
    const int64_t p = idx / in_plane, local = idx % in_plane;
    // In padded coordinates: output rows oh with oh * stride <= ih + padding < oh * stride + kernel.
    const int64_t ih = local / g.width + g.padding, iw = local % g.width + g.padding;
    const int64_t oh_first = ih >= g.kernel ? (ih - g.kernel) / g.stride + 1 : 0;
    const int64_t oh_last = min(ih / g.stride, g.out_h - 1);
    const int64_t ow_first = iw >= g.kernel ? (iw - g.kernel) / g.stride + 1 : 0;
    const int64_t ow_last = min(iw / g.stride, g.out_w - 1);
    float acc = gx[idx];
    for (int64_t oh = oh_first; oh <= oh_last; ++oh)
      for (int64_t ow = ow_first; ow <= ow_last; ++ow) {
        const int64_t o = p * out_plane + oh * g.out_w + ow;
        if (argmax[o] == local) acc += gy[o];
      }
    gx[idx] = acc;
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

// Batch normalisation's per-channel reductions run one block per channel; threads stride over
// (sample, position), so the order is fixed and the result deterministic.
__device__ int64_t bn_index(BatchNormShape s, int64_t c, int64_t j) {
  return ((j / s.inner) * s.channels + c) * s.inner + j % s.inner;
}

__global__ void batchnorm_sums_kernel(const float* __restrict__ x, double* __restrict__ sums,
                                      BatchNormShape s) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, count = s.batch * s.inner;
  double acc = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) acc += x[bn_index(s, c, j)];
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    sums[c] = total;
    if (c == 0) sums[s.channels] = static_cast<double>(count);
  }
}

__global__ void batchnorm_squares_kernel(const float* __restrict__ x, const double* __restrict__ sums,
                                         double* __restrict__ squares, BatchNormShape s) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, count = s.batch * s.inner;
  const auto mean = static_cast<float>(sums[c] / sums[s.channels]);  // the mean normalisation uses
  double acc = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const float d = x[bn_index(s, c, j)] - mean;
    acc += d * d;
  }
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) squares[c] = total;
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

__global__ void batchnorm_normalize_kernel(const float* __restrict__ x, const float* __restrict__ stats,
                                           const float* __restrict__ gamma, const float* __restrict__ beta,
                                           float* __restrict__ y, BatchNormShape s) {
  const int64_t n = s.batch * s.channels * s.inner;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = (i / s.inner) % s.channels;
    const float scale = stats[s.channels + c] * gamma[c], shift = beta[c] - stats[c] * scale;
    y[i] = x[i] * scale + shift;
  }
}

__global__ void batchnorm_backward_reduce_kernel(const float* __restrict__ gy, const float* __restrict__ x,
                                                 const float* __restrict__ stats,
                                                 double* __restrict__ grad_sums, float* __restrict__ ggamma,
                                                 float* __restrict__ gbeta, BatchNormShape s) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, count = s.batch * s.inner;
  const float mean = stats[c];
  double acc_gy = 0, acc_gy_xmu = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t at = bn_index(s, c, j);
    acc_gy += gy[at];
    acc_gy_xmu += gy[at] * (x[at] - mean);
  }
  const double sum_gy = block_sum(acc_gy, shared), sum_gy_xmu = block_sum(acc_gy_xmu, shared);
  if (threadIdx.x == 0) {
    grad_sums[c] = sum_gy;
    grad_sums[s.channels + c] = sum_gy_xmu;
    if (ggamma) ggamma[c] += static_cast<float>(sum_gy_xmu * stats[s.channels + c]);
    if (gbeta) gbeta[c] += static_cast<float>(sum_gy);
  }
}

// grad_sums null: fixed statistics (evaluation), gx += gamma invstd gy.
__global__ void batchnorm_backward_input_kernel(const float* __restrict__ gy, const float* __restrict__ x,
                                                const float* __restrict__ stats,
                                                const float* __restrict__ gamma,
                                                const double* __restrict__ grad_sums,
                                                const double* __restrict__ sums, float* __restrict__ gx,
                                                BatchNormShape s) {
  const int64_t n = s.batch * s.channels * s.inner;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = (i / s.inner) % s.channels;
    const float mean = stats[c], invstd = stats[s.channels + c], scale = gamma[c] * invstd;
    if (grad_sums == nullptr) {
      gx[i] += scale * gy[i];
      continue;
    }
    const double count = sums[s.channels];
    const auto mean_gy = static_cast<float>(grad_sums[c] / count);
    const auto mean_gy_xmu = static_cast<float>(grad_sums[s.channels + c] / count);
    const float slope = -scale * invstd * invstd * mean_gy_xmu;
    const float offset = -scale * mean_gy - slope * mean;
    gx[i] += gy[i] * scale + x[i] * slope + offset;
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

__global__ void mean_planes_backward_kernel(const float* __restrict__ gy, float* __restrict__ gx,
                                            int64_t planes, int64_t plane_size) {
  const int64_t n = planes * plane_size;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    gx[i] += gy[i / plane_size] / static_cast<float>(plane_size);
}

__device__ float activate(Activation f, float v) {
  switch (f) {
    case Activation::kRelu:
      return v > 0.0f ? v : 0.0f;
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
    for (int64_t c = lane; c < classes; c += 32) denom += expf(row[c] - peak);
    for (int offset = 16; offset > 0; offset /= 2) denom += __shfl_xor_sync(0xffffffffu, denom, offset);
    for (int64_t c = lane; c < classes; c += 32) probs[b * classes + c] = expf(row[c] - peak) / denom;
    if (lane == 0) row_loss[b] = logf(denom) - (row[labels[b]] - peak);
  }
}

__global__ void cross_entropy_backward_kernel(const float* __restrict__ probs,
                                              const int32_t* __restrict__ labels,
                                              const float* __restrict__ gloss, float* __restrict__ g,
                                              int64_t batch, int64_t classes) {
  const float scale = gloss[0] / static_cast<float>(batch);
  const int64_t n = batch * classes;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t b = i / classes, c = i % classes;
    g[i] += scale * (probs[i] - (c == labels[b] ? 1.0f : 0.0f));
  }
}

__global__ void mse_backward_kernel(const float* __restrict__ p, const float* __restrict__ t,
                                    const float* __restrict__ gloss, float* __restrict__ g, int64_t n) {
  const float scale = 2.0f * gloss[0] / static_cast<float>(n);
  for (int64_t i = first_index(); i < n; i += grid_stride()) g[i] += scale * (p[i] - t[i]);
}

// Block partials of sum(x) or sum((x - t)^2) in double, a tree in shared memory per block.
__global__ void partial_sums_kernel(const float* __restrict__ x, const float* __restrict__ t, int64_t n,
                                    double* __restrict__ partials) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double v = t ? static_cast<double>(x[i]) - t[i] : x[i];
    acc += t ? v * v : v;
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

__global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                           float* __restrict__ momentum_buffer, int64_t n, SgdStep s) {
  float unused = 0.0f;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    sgd_update(params[i], grads[i], momentum_buffer ? momentum_buffer[i] : unused, s);
}

__global__ void adam_kernel(float* __restrict__ params, const float* __restrict__ grads,
                            float* __restrict__ m, float* __restrict__ v, int64_t n, AdamStep s) {
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
  DPTRAIN_LAUNCH(add_bias_kernel, s.outer * s.channels * s.inner, stream, x, bias, y, s, relu);
}

void bias_gradient(const float* gy, float* gbias, BiasShape s, cudaStream_t stream) {
  if (s.channels == 0) return;
  bias_gradient_kernel<<<static_cast<unsigned>(s.channels), kThreads, 0, stream>>>(gy, gbias, s);
  DPTRAIN_CUDA_CHECK_LAUNCH();
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

void batchnorm_sums(const float* x, double* sums, BatchNormShape s, cudaStream_t stream) {
  if (s.channels == 0) return;
  batchnorm_sums_kernel<<<static_cast<unsigned>(s.channels), kThreads, 0, stream>>>(x, sums, s);
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s,
                       cudaStream_t stream) {
  if (s.channels == 0) return;
  batchnorm_squares_kernel<<<static_cast<unsigned>(s.channels), kThreads, 0, stream>>>(x, sums, squares, s);
  DPTRAIN_CUDA_CHECK_LAUNCH();
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
                         BatchNormShape s, cudaStream_t stream) {
  DPTRAIN_LAUNCH(batchnorm_normalize_kernel, s.batch * s.channels * s.inner, stream, x, stats, gamma, beta, y,
                 s);
}

void batchnorm_backward_reduce(const float* gy, const float* x, const float* stats, double* grad_sums,
                               float* ggamma, float* gbeta, BatchNormShape s, cudaStream_t stream) {
  if (s.channels == 0) return;
  batchnorm_backward_reduce_kernel<<<static_cast<unsigned>(s.channels), kThreads, 0, stream>>>(
      gy, x, stats, grad_sums, ggamma, gbeta, s);
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void batchnorm_backward_input(const float* gy, const float* x, const float* stats, const float* gamma,
                              const double* grad_sums, const double* sums, float* gx, BatchNormShape s,
                              cudaStream_t stream) {
  DPTRAIN_LAUNCH(batchnorm_backward_input_kernel, s.batch * s.channels * s.inner, stream, gy, x, stats, gamma,
                 grad_sums, sums, gx, s);
}

void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size, cudaStream_t stream) {
  if (planes == 0) return;
  const int64_t warps_per_block = kThreads / 32;
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((planes + warps_per_block - 1) / warps_per_block, 1, 132 * 32));
  mean_planes_kernel<<<blocks, kThreads, 0, stream>>>(x, y, planes, plane_size);
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size,
                          cudaStream_t stream) {
  DPTRAIN_LAUNCH(mean_planes_backward_kernel, planes * plane_size, stream, gy, gx, planes, plane_size);
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
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(const float* probs, const int32_t* labels, const float* gloss, float* glogits,
                            int64_t batch, int64_t classes, cudaStream_t stream) {
  DPTRAIN_LAUNCH(cross_entropy_backward_kernel, batch * classes, stream, probs, labels, gloss, glogits, batch,
                 classes);
}

void mse_backward(const float* prediction, const float* target, const float* gloss, float* gprediction,
                  int64_t n, cudaStream_t stream) {
  DPTRAIN_LAUNCH(mse_backward_kernel, n, stream, prediction, target, gloss, gprediction, n);
}

void reduce_sum(const float* x, const float* t, int64_t n, double scale, double* partials, float* out,
                cudaStream_t stream) {
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kReductionBlocks));
  partial_sums_kernel<<<blocks, kThreads, 0, stream>>>(x, t, n, partials);
  DPTRAIN_CUDA_CHECK_LAUNCH();
  final_sum_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, scale, out);
  DPTRAIN_CUDA_CHECK_LAUNCH();
}

void flag_non_finite(const float* x, int64_t n, int32_t* flag, cudaStream_t stream) {
  DPTRAIN_LAUNCH(flag_non_finite_kernel, n, stream, x, n, flag);
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
