// Fills, pointwise ops, pooling, dropout, losses, reductions, the finiteness check and the optimizer
// updates on the CPU: plain loops the compiler vectorises, OpenMP across cores for large tensors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/activation_rules.h"
#include "core/cpu/kernels.h"
#include "core/cpu/packet.h"
#include "core/rng.h"

namespace dptrain::cpu {
namespace {

// y = f(x) pointwise, and gx += gy * dy/dx written in terms of x and y.
template <typename Forward>
void pointwise(const float* xs, float* ys, int64_t n, Forward f) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) ys[i] = f(xs[i]);
}
template <typename Derivative>
void pointwise_backward(const float* xs, const float* ys, const float* gy, float* gx, int64_t n,
                        Derivative dfdx) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) gx[i] += gy[i] * dfdx(xs[i], ys[i]);
}

// The maximum of the window whose top-left corner is at `corner` of a plane of row length w, and
// its position. With the kernel size known at compile time GCC unrolls the window and keeps the
// selects branch-free; with a runtime size it emits branches that mispredict on real activations
// (measured 6x slower for 2x2).
template <int64_t kFixedKernel>
inline void window_max(const float* plane, int64_t w, int64_t corner, int64_t runtime_kernel,
                       float& best_value, int64_t& best) {
  const int64_t kernel = kFixedKernel > 0 ? kFixedKernel : runtime_kernel;
  best = corner;
  best_value = plane[corner];
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
}

// One input plane [h, w] -> one output plane.
template <int64_t kFixedKernel>
void pool_plane(const float* plane, float* y, int32_t* win, int64_t h, int64_t w, int64_t runtime_kernel,
                int64_t stride) {
  const int64_t kernel = kFixedKernel > 0 ? kFixedKernel : runtime_kernel;
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; ++j) {
      float best_value;
      int64_t best;
      window_max<kFixedKernel>(plane, w, i * stride * w + j * stride, kernel, best_value, best);
      y[i * ow + j] = best_value;
      if (win) win[i * ow + j] = static_cast<int32_t>(best);
    }
}

// Outputs [j0, j1) of one output row whose windows lie wholly inside the plane, window row `top`, at
// compile-time kernel and stride: the window's taps run in the outer loops and the outputs in the
// inner one, which GCC vectorises (strided loads); each output still meets its taps in row-major
// order, so ties and NaN resolve as in window_max.
template <int64_t kKernel, int64_t kStride>
void pool_row_inside(const float* plane, int64_t w, int64_t top, int64_t padding, int64_t j0, int64_t j1,
                     float* y, int32_t* win) {
  const int64_t first = top * w + j0 * kStride - padding;
  for (int64_t j = 0; j < j1 - j0; ++j) {
    y[j] = plane[first + j * kStride];
    win[j] = static_cast<int32_t>(first + j * kStride);
  }
  for (int64_t ki = 0; ki < kKernel; ++ki)
    for (int64_t kj = 0; kj < kKernel; ++kj) {
      const int64_t tap = first + ki * w + kj;
      const float* row = plane + tap;
#pragma omp simd
      for (int64_t j = 0; j < j1 - j0; ++j) {
        const float v = row[j * kStride];
        const bool take = v > y[j] || v != v;
        y[j] = take ? v : y[j];
        win[j] = take ? static_cast<int32_t>(tap + j * kStride) : win[j];
      }
    }
}

// With padding: positions outside the plane take no part (PyTorch pads with -inf). Windows wholly
// inside the plane (all but a one-output border for ResNet's 3x3/2 stem pooling) skip the bounds
// checks, and at 3x3/2 run a row at a time (pool_row_inside); the border checks bounds. (Bounds
// checks everywhere made the stem's pooling 4% of a resnet18 step.)
template <int64_t kFixedKernel>
void pool_plane_padded(const float* plane, float* y, int32_t* win, const Pool2dGeometry& g) {
  const int64_t kernel = kFixedKernel > 0 ? kFixedKernel : g.kernel;
  // Outputs j0 <= j < j1 have their windows' columns inside the plane.
  const int64_t j0 = std::min<int64_t>(g.out_w, (g.padding + g.stride - 1) / g.stride);
  const int64_t j1 = std::max(j0, std::min<int64_t>(g.out_w, (g.width - kernel + g.padding) / g.stride + 1));
  thread_local std::vector<int32_t> row_winners;
  for (int64_t i = 0; i < g.out_h; ++i) {
    const int64_t top = i * g.stride - g.padding;
    const bool rows_inside = top >= 0 && top + kernel <= g.height;
    float* y_row = y + i * g.out_w;
    int32_t* win_row = win ? win + i * g.out_w : nullptr;
    const bool row_at_once = kFixedKernel == 3 && g.stride == 2 && rows_inside && j1 > j0;
    if (row_at_once) {
      if (!win_row) row_winners.resize(static_cast<std::size_t>(g.out_w));
      pool_row_inside<3, 2>(plane, g.width, top, g.padding, j0, j1, y_row + j0,
                            (win_row ? win_row : row_winners.data()) + j0);
    }
    for (int64_t j = 0; j < g.out_w; ++j) {
      const bool columns_inside = j >= j0 && j < j1;
      if (row_at_once && columns_inside) continue;  // done above
      const int64_t left = j * g.stride - g.padding;
      int64_t best = -1;
      float best_value = -std::numeric_limits<float>::infinity();
      if (rows_inside && columns_inside) {
        window_max<kFixedKernel>(plane, g.width, top * g.width + left, kernel, best_value, best);
      } else {
        for (int64_t r = std::max<int64_t>(top, 0); r < std::min<int64_t>(top + kernel, g.height); ++r)
          for (int64_t c = std::max<int64_t>(left, 0); c < std::min<int64_t>(left + kernel, g.width); ++c) {
            const float v = plane[r * g.width + c];
            if (best < 0 || v > best_value || v != v) {
              best_value = v;
              best = r * g.width + c;
            }
          }
      }
      y_row[j] = best_value;
      if (win_row) win_row[j] = static_cast<int32_t>(best);
    }
  }
}

// Which of a window's earlier value `before` and later value `after` a row-major scan keeps (as in
// window_max): the later one if greater or NaN. Taking the same value twice changes nothing.
inline bool later_wins(float before, float after) {
  return after > before || after != after;
}

// ResNet's stem pooling, 3x3 windows at stride 2 with padding 1, over planes of even width: output
// (i, j) covers rows 2i-1 .. 2i+1 and columns 2j-1 .. 2j+1, those inside the plane. In passes that
// vectorise, where the scan per output did not (15 whole windows a row at 64x64 input, less than a
// packet): the plane split into its even and odd columns; each input row's winner among each window's
// columns; each window's winner among its rows' winners, in order. A row-major scan keeps the first
// maximum, or the last NaN if one came: the first row that holds it, and that row's first column,
// which is what the passes keep.
void pool_3x3_stride2_padded(const float* plane, float* y, int32_t* win, const Pool2dGeometry& g) {
  const int64_t out_w = g.out_w, rows = g.height, n = rows * out_w;
  thread_local std::vector<float> buffers;
  thread_local std::vector<int32_t> row_at;
  buffers.resize(static_cast<std::size_t>(3 * n + 1));
  row_at.resize(static_cast<std::size_t>(n + out_w));  // and a row of winners not kept
  // Column 2j of row r at even[r * out_w + j], column 2j + 1 at odd[r * out_w + j]; odd[-1] is a
  // float of slack that the first row's j = 0 reads and ignores.
  float *even = buffers.data(), *odd = even + n + 1, *best = odd + n;
  int32_t* at = row_at.data();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    even[i] = plane[2 * i];
    odd[i] = plane[2 * i + 1];
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float *evens = even + r * out_w, *odds = odd + r * out_w;
    float* row_best = best + r * out_w;
    int32_t* row_winner = at + r * out_w;
    const auto row_start = static_cast<int32_t>(r * g.width);
    // Columns 2j - 1 (none at j = 0, a select, so that the row fills whole packets), 2j and 2j + 1.
#pragma omp simd
    for (int64_t j = 0; j < out_w; ++j) {
      const int32_t middle = row_start + 2 * static_cast<int32_t>(j);
      const bool middle_wins = j == 0 || later_wins(odds[j - 1], evens[j]);
      const float value = middle_wins ? evens[j] : odds[j - 1];
      const int32_t index = middle_wins ? middle : middle - 1;
      const bool right_wins = later_wins(value, odds[j]);
      row_best[j] = right_wins ? odds[j] : value;
      row_winner[j] = right_wins ? middle + 1 : index;
    }
  }
  for (int64_t i = 0; i < g.out_h; ++i) {
    // Rows 2i - 1 (none at i = 0: row 2i twice), 2i and 2i + 1 (none past the plane: row 2i again).
    const int64_t first = std::max<int64_t>(2 * i - 1, 0), last = std::min<int64_t>(2 * i + 1, rows - 1);
    const float *top = best + first * out_w, *middle = best + 2 * i * out_w, *bottom = best + last * out_w;
    const int32_t *top_at = at + first * out_w, *middle_at = at + 2 * i * out_w,
                  *bottom_at = at + last * out_w;
    float* y_row = y + i * out_w;
    int32_t* win_row = win ? win + i * out_w : at + n;
#pragma omp simd
    for (int64_t j = 0; j < out_w; ++j) {
      const bool middle_wins = later_wins(top[j], middle[j]);
      const float value = middle_wins ? middle[j] : top[j];
      const int32_t index = middle_wins ? middle_at[j] : top_at[j];
      const bool bottom_wins = later_wins(value, bottom[j]);
      y_row[j] = bottom_wins ? bottom[j] : value;
      win_row[j] = bottom_wins ? bottom_at[j] : index;
    }
  }
}

// Inf and NaN are the floats whose exponent bits are all ones. An integer OR-reduction vectorises
// where a float accumulation would not (float addition is not associative).
inline uint32_t not_finite(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
}

}  // namespace

void activation(Activation f, const float* x, float* y, int64_t n) {
  switch (f) {
    case Activation::kRelu:
      return pointwise(x, y, n, [](float v) { return relu_of(v); });
    case Activation::kTanh:
      return pointwise(x, y, n, [](float v) { return std::tanh(v); });
    case Activation::kSigmoid:
      return pointwise(x, y, n, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
  }
}

void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx,
                         int64_t n) {
  switch (f) {
    case Activation::kRelu:
      return pointwise_backward(x, y, gy, gx, n, [](float v, float) { return relu_derivative(v); });
    case Activation::kTanh:
      return pointwise_backward(x, y, gy, gx, n, [](float, float out) { return 1.0f - out * out; });
    case Activation::kSigmoid:
      return pointwise_backward(x, y, gy, gx, n, [](float, float out) { return out * (1.0f - out); });
  }
}

void maxpool2d_plane(const float* plane, float* y, int32_t* argmax, const Pool2dGeometry& g) {
  if (g.kernel == 3 && g.stride == 2 && g.padding == 1 && g.width % 2 == 0)
    return pool_3x3_stride2_padded(plane, y, argmax, g);
  if (g.padding > 0)
    return (g.kernel == 3 ? pool_plane_padded<3> : pool_plane_padded<0>)(plane, y, argmax, g);
  const auto pool = g.kernel == 2 ? pool_plane<2> : g.kernel == 3 ? pool_plane<3> : pool_plane<0>;
  pool(plane, y, argmax, g.height, g.width, g.kernel, g.stride);
}

void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) {
  const int64_t in_plane = g.height * g.width, out_plane = g.out_h * g.out_w;
#pragma omp parallel for schedule(static) if (g.planes * in_plane > 65536)
  for (int64_t p = 0; p < g.planes; ++p)
    maxpool2d_plane(x + p * in_plane, y + p * out_plane, argmax ? argmax + p * out_plane : nullptr, g);
}

void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx, const Pool2dGeometry& g) {
  const int64_t in_plane = g.height * g.width, out_plane = g.out_h * g.out_w;
#pragma omp parallel for schedule(static) if (g.planes * in_plane > 65536)
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t o = 0; o < out_plane; ++o)
      gx[p * in_plane + argmax[p * out_plane + o]] += gy[p * out_plane + o];
}

void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state) {
  const float keep_scale = 1.0f / (1.0f - p);
  Rng rng(rng_state);
  for (int64_t i = 0; i < n; ++i) mask[i] = rng.uniform() >= p ? keep_scale : 0.0f;
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
}

void dropout_backward(const float* gy, const float* mask, float* gx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gx[i] += gy[i] * mask[i];
}

void add(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void cross_entropy(const float* z, std::span<const int32_t> labels, float* q, float* loss, int64_t batch,
                   int64_t classes) {
  double total = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = z + b * classes;
    const float peak = *std::max_element(row, row + classes);
    float denom = 0.0f;
    for (int64_t c = 0; c < classes; ++c) denom += (q[b * classes + c] = std::exp(row[c] - peak));
    for (int64_t c = 0; c < classes; ++c) q[b * classes + c] /= denom;
    total += std::log(denom) -
             (row[labels[b]] - peak);  // stable: -log softmax = log sum exp(z - max) - (z_y - max)
  }
  *loss = static_cast<float>(total / batch);
}

void cross_entropy_backward(const float* q, std::span<const int32_t> labels, const float* gloss, float* g,
                            int64_t batch, int64_t classes) {
  const float scale = gloss[0] / static_cast<float>(batch);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < classes; ++c)
      g[b * classes + c] += scale * (q[b * classes + c] - (c == labels[b] ? 1.0f : 0.0f));
}

void mse(const float* p, const float* t, float* loss, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(p[i] - t[i]) * (p[i] - t[i]);
  *loss = static_cast<float>(total / n);
}

void mse_backward(const float* p, const float* t, const float* gloss, float* g, int64_t n) {
  const float scale = 2.0f * gloss[0] / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) g[i] += scale * (p[i] - t[i]);
}

void sum(const float* x, float* out, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += x[i];
  *out = static_cast<float>(total);
}

// Above 1 MiB a fill is streamed to memory, its unaligned head and tail excepted: a plain store that
// misses reads its line from memory first, a streamed one does not. The large fills are the
// gradients' zeros before every backward, which stay in memory until the backward adds into them.
// (With memset, which glibc streams only past a share of the L3 that this VM reports as 480 MiB,
// they took 6.7 ms of resnet18's step at 64x64 and 21 of ResNet-50's at batch 16; streamed, 3.8 and
// 10.6, one Intel Xeon core.)
void fill(float* x, int64_t n, float value) {
  constexpr int64_t kStreamedFloats = int64_t{1} << 18;
  int64_t done = 0;
  if (simd::kStreamingStores && n >= kStreamedFloats) {
    for (; !simd::streamable(x + done, simd::kLanes); ++done) x[done] = value;
    const int64_t body = (n - done) / simd::kLanes * simd::kLanes;
    simd::write_streamed(x + done, body,
                         [&](float* piece, int64_t, int64_t count) { std::fill_n(piece, count, value); });
    simd::stream_fence();
    done += body;
  }
  std::fill_n(x + done, n - done, value);
}

bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= not_finite(x[i]);
  return bad == 0;
}

// Blocks of 2^14 elements, summed in parallel, each in double in 8 lanes (element i in lane i % 8)
// that are then added in order, and the blocks' sums added in order: the same bits at any thread
// count.
double sum_of_squares(const float* x, int64_t n) {
  constexpr int64_t kBlock = int64_t{1} << 14, kLanes = 8;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> block_sums(static_cast<std::size_t>(blocks));
#pragma omp parallel for schedule(static) if (n > 16 * kBlock)
  for (int64_t b = 0; b < blocks; ++b) {
    double lanes[kLanes] = {};
    const float* v = x + b * kBlock;
    const int64_t count = std::min(kBlock, n - b * kBlock);
    int64_t i = 0;
    for (; i + kLanes <= count; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(v[i + l]) * v[i + l];
    for (; i < count; ++i) lanes[i % kLanes] += static_cast<double>(v[i]) * v[i];
    double sum = 0;
    for (double lane : lanes) sum += lane;
    block_sums[static_cast<std::size_t>(b)] = sum;
  }
  double total = 0;
  for (double s : block_sums) total += s;
  return total;
}

// Restrict pointers and a by-value copy of the step: with the scalars read through a reference GCC
// assumes the stores may change them and does not vectorise the loop.
void sgd_step(float* __restrict params, const float* __restrict grads, float* __restrict momentum_buffer,
              int64_t n, const SgdStep& step) {
  const SgdStep s = step;
  if (s.skip_if_set != nullptr && *s.skip_if_set != 0) return;
  if (s.momentum == 0.0f) {
    float unused = 0.0f;
    for (int64_t i = 0; i < n; ++i) sgd_update(params[i], grads[i], unused, s);
    return;
  }
  for (int64_t i = 0; i < n; ++i) sgd_update(params[i], grads[i], momentum_buffer[i], s);
}

void adam_step(float* __restrict params, const float* __restrict grads, float* __restrict exp_avg,
               float* __restrict exp_avg_sq, int64_t n, const AdamStep& step) {
  const AdamStep s = step;
  if (s.skip_if_set != nullptr && *s.skip_if_set != 0) return;
  for (int64_t i = 0; i < n; ++i) adam_update(params[i], grads[i], exp_avg[i], exp_avg_sq[i], s);
}

}  // namespace dptrain::cpu
