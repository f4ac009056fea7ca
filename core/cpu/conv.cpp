// conv2d on the CPU. Convolutions over small planes, at stride 1 or 2, run as per-tap GEMMs
// (conv_small.h), others that conv_direct.h takes as direct kernels; the rest as im2col + GEMM over chunks of
// the batch, each chunk's column matrix [C*KH*KW, chunk*OH*OW] sized to stay in L2 (a whole-batch column
// matrix, 18 MB for the MNIST CNN's second layer, cost more than the GEMM it fed), its columns
// recomputed in backward rather than kept.
// conv2d -> ReLU -> max pooling pools each plane of sums while it is in cache, so the conv output
// never goes to memory; its backward rebuilds the output gradient from the pooled output and the
// winners' positions. The bias, ReLU and pooling of each plane, and the writing of the output
// gradient, are the same code on every path.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/activation_rules.h"
#include "core/cpu/conv_direct.h"
#include "core/cpu/conv_small.h"
#include "core/cpu/conv_winograd.h"
#include "core/cpu/eigen.h"
#include "core/cpu/gemm.h"
#include "core/cpu/kernels.h"
#include "core/cpu/packet.h"
#include "core/error.h"
#include "core/storage.h"

namespace dptrain::cpu {
namespace {

// K = patch(): rows of the column matrix; P = pixels(): outputs per sample and channel.
using ConvGeometry = Conv2dGeometry;

// A 1x1 convolution at stride 1 without padding: one sample's column matrix [C, P] is that sample's
// input as it lies, and its columns' gradient is the input's gradient as it lies (added into it, or
// written where it is to be written), so one-sample chunks read and write the tensors themselves
// instead of copies.
bool columns_are_input(const ConvGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride == 1 && g.padding == 0;
}

// Samples per chunk: the chunk's scratch (columns, product or output gradient, and in backward the
// columns' gradient when the input's is wanted) in about 1 MiB of floats, this machine's L2 per core,
// but at least kMinColumns columns: every GEMM copies its blocks of B and walks all of A, which a few
// columns do not repay (resnet18 at 64x64 has 2x2 planes and 4,608-float patches: 12 samples a chunk
// ran its 3x3 layers of 512 channels at 37 GFLOP/s, the whole batch of 32 at 69, when every chunk's
// GEMM also packed W^T again; it is packed once a call since 2026-12-06). Except that a 1x1
// convolution at stride 1 over planes of kMinInPlacePixels or more runs a chunk per sample, in place: a chunk
// of several samples copies its input into columns, its output gradient into a matrix and the columns'
// gradient back, and only over smaller planes do its wider GEMMs repay that (one Intel Xeon core, batch 16,
// ms a call forward and backward, chunks of 4 samples -> one: ResNet-50's 1024->256 over 14x14 14.8 -> 13.7
// and 29.8 -> 26.5, 256->1024 14.6 -> 13.5 and 28.5 -> 27.9; 512->512 over 12x12 9.9 -> 8.8 and 19.6 -> 17.8,
// over 10x10 7.1 -> 7.0 and 14.1 -> 13.4; over 7x7 the whole batch's 16.5 and 31.3 became 21 and 34).
constexpr int64_t kMinInPlacePixels = 96;
constexpr int64_t kTargetFloats = 256 * 1024;
constexpr int64_t kMinColumns = 768;
int64_t chunk_samples(const ConvGeometry& g, bool input_gradient) {
  if (columns_are_input(g) && g.pixels() >= kMinInPlacePixels) return 1;
  const int64_t per_sample = (g.patch() * (input_gradient ? 2 : 1) + g.out_channels) * g.pixels();
  const int64_t wide_enough = (kMinColumns + g.pixels() - 1) / g.pixels();
  return std::clamp<int64_t>(std::max(kTargetFloats / per_sample, wide_enough), 1, g.batch);
}

// Output rows [row0, row1) of samples [first, first + count): the part of the batch that one column
// matrix holds, [K, count * (row1 - row0) * OW]. Whole rows of whole samples, or, where one sample's
// scratch alone outgrows the target, a band of one sample's rows.
struct Rows {
  int64_t first, count, row0, row1;
  int64_t columns(const ConvGeometry& g) const { return count * (row1 - row0) * g.out_w; }
};

// Output rows per band of a one-sample chunk: all of them unless the sample's scratch exceeds about 1
// MiB of floats (chunk_samples' target), and then as many as keep it there, but at least kMinColumns'
// worth. ResNet-50's stem has a column matrix of 7.4 MB a sample (147 floats for each of 12,544
// outputs), written to memory and read back; in bands of 11 rows it stays in L2 (one Intel Xeon core,
// batch 16: forward 49.0 -> 38.4 ms a step, the weight gradient 47.6 -> 47.4; with the input gradient
// too, a stem that is not the first layer, 110 -> 95 ms a call).
int64_t band_rows(const ConvGeometry& g, bool input_gradient) {
  const int64_t per_row = (g.patch() * (input_gradient ? 2 : 1) + g.out_channels) * g.out_w;
  const int64_t wide_enough = (kMinColumns + g.out_w - 1) / g.out_w;
  return std::clamp<int64_t>(std::max(kTargetFloats / per_row, wide_enough), 1, g.out_h);
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

// Row k of the column matrix (im2col, below). Geometry by value: OpenMP-outlined loops re-read shared state.
void im2col_row(const ConvGeometry g, const float* x, Rows rows, int64_t k, float* cols, const float* split) {
  const int64_t n = rows.columns(g), band = (rows.row1 - rows.row0) * g.out_w;
  const int64_t c = k / (g.kernel_h * g.kernel_w), kh = (k / g.kernel_w) % g.kernel_h, kw = k % g.kernel_w;
  const ValidRange valid = valid_columns(g, kw);
  const int64_t shift = kw - g.padding;  // input column = ow * stride + shift
  // At stride 2, input column 2 ow + shift is float ow + half_shift of the row's half `phase`.
  const int64_t half = (g.width + 1) / 2, phase = shift & 1, half_shift = (shift - phase) / 2;
  float* row = cols + k * n;
  for (int64_t b = 0; b < rows.count; ++b) {
    const float* plane = x + ((rows.first + b) * g.channels + c) * g.height * g.width;
    for (int64_t oh = rows.row0; oh < rows.row1; ++oh) {
      const int64_t ih = oh * g.stride - g.padding + kh;
      float* dst = row + b * band + (oh - rows.row0) * g.out_w;
      if (ih < 0 || ih >= g.height) {
        std::fill_n(dst, g.out_w, 0.0f);
        continue;
      }
      std::fill_n(dst, valid.begin, 0.0f);
      if (g.stride == 1) {
        const float* src = plane + ih * g.width + shift;
        std::copy(src + valid.begin, src + valid.end, dst + valid.begin);
      } else if (split) {
        const float* src =
            split + ((b * g.channels + c) * g.height + ih) * 2 * half + phase * half + half_shift;
#pragma omp simd
        for (int64_t ow = valid.begin; ow < valid.end; ++ow) dst[ow] = src[ow];
      } else {
        const float* src = plane + ih * g.width + shift;
        for (int64_t ow = valid.begin; ow < valid.end; ++ow) dst[ow] = src[ow * g.stride];
      }
      std::fill(dst + valid.end, dst + g.out_w, 0.0f);
    }
  }
}

// Samples [first, first + count) of x with each row split into its even columns and then its odd
// ones, (W + 1) / 2 floats each. A copy at stride 2 stays scalar, about a cycle a float; this way
// each input float is copied once, not once per kernel tap that reads it (the 7x7/2 stem's
// column matrix holds 147 floats per output pixel, from 3 input floats per pixel: its forward went
// from 4.2 to 3.6 ms a step in resnet18 at 64x64, from 22.5 to 18.8 in ResNet-50 at 224x224,
// its backward from 4.9 to 4.2 and from 27.7 to 24.4; one AMD EPYC core).
const float* split_columns(const ConvGeometry& g, const float* x, int64_t first, int64_t count) {
  enum Slot { kSplitColumns };
  const int64_t half = (g.width + 1) / 2, rows = count * g.channels * g.height;
  float* split = simd::thread_scratch<kSplitColumns>(rows * 2 * half);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* from = x + (first * g.channels * g.height + r) * g.width;
    float* even = split + r * 2 * half;
    float* odd = even + half;
    for (int64_t j = 0; j < g.width / 2; ++j) {
      even[j] = from[2 * j];
      odd[j] = from[2 * j + 1];
    }
    if (g.width % 2 == 1) even[half - 1] = from[g.width - 1];
  }
  return split;
}

// The rows of samples [first, first + count) split for im2col (split_columns), or nullptr where it
// copies from the rows as they lie. Where a row's taps read each input float at most twice (3x3/2,
// 1x1/2) the split's extra pass did not pay: ResNet-50's 3x3/2 and 1x1/2 layers took 2-3 ms a step
// longer with it.
const float* split_for_im2col(const ConvGeometry& g, const float* x, int64_t first, int64_t count) {
  return g.stride == 2 && g.kernel_w > 3 ? split_columns(g, x, first, count) : nullptr;
}

// For output rows `rows`: cols[k, b*R*OW + (oh - row0)*OW + ow] = x[first + b, c, oh*s - p + kh,
// ow*s - p + kw] (0 outside), k = (c, kh, kw), R the rows. Bounds are resolved per row, so the inner
// loop is a plain contiguous copy: at stride 1 from the input's row, at stride 2 from the even or odd
// half of that row, which split (split_for_im2col of the same samples) holds side by side.
void im2col(const ConvGeometry& g, const float* x, Rows rows, const float* split, float* cols) {
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < g.patch(); ++k) im2col_row(g, x, rows, k, cols, split);
}

// The adjoint of im2col for output rows `rows`: gx[b, c, ih, iw] += gcols[k, ...]. Parallel over
// channels, since every k of one channel writes the same input plane.
void col2im_channel(const ConvGeometry g, const float* gcols, Rows rows, int64_t c, float* gx) {
  const int64_t n = rows.columns(g), band = (rows.row1 - rows.row0) * g.out_w;
  for (int64_t kh = 0; kh < g.kernel_h; ++kh)
    for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
      const float* row = gcols + ((c * g.kernel_h + kh) * g.kernel_w + kw) * n;
      const ValidRange valid = valid_columns(g, kw);
      const int64_t shift = kw - g.padding;
      for (int64_t b = 0; b < rows.count; ++b) {
        float* plane = gx + ((rows.first + b) * g.channels + c) * g.height * g.width;
        for (int64_t oh = rows.row0; oh < rows.row1; ++oh) {
          const int64_t ih = oh * g.stride - g.padding + kh;
          if (ih < 0 || ih >= g.height) continue;
          const float* src = row + b * band + (oh - rows.row0) * g.out_w;
          float* dst = plane + ih * g.width + shift;
          // With g.stride in the index GCC keeps the loop scalar; at stride 1 it vectorises (ResNet-50's
          // 3x3 layers of 256 channels over 14x14: backward 206 -> 196 ms a step, one AMD EPYC core).
          if (g.stride == 1) {
#pragma omp simd
            for (int64_t ow = valid.begin; ow < valid.end; ++ow) dst[ow] += src[ow];
          } else {
            for (int64_t ow = valid.begin; ow < valid.end; ++ow) dst[ow * g.stride] += src[ow];
          }
        }
      }
    }
}

void col2im_add(const ConvGeometry& g, const float* gcols, Rows rows, float* gx) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < g.channels; ++c) col2im_channel(g, gcols, rows, c, gx);
}

// Backward's GEMMs for samples [first, first + count), given their output gradient gy as [O, count*P],
// in bands of rows_per_band output rows (out_h unless the chunk is one sample). gx is added into,
// except that a one-sample 1x1 chunk (in_place) writes it where gx.overwrite says to: the bits of
// adding into zeros, as the GEMM's sums start from +0 (never -0). backward_with leaves overwrite set
// only where every chunk is such a chunk.
void chunk_backward(const ConvGeometry& g, const float* gy, const float* x, PackedLeft w_transposed,
                    GradientOut gx, float* gw, float* gbias, int64_t first, int64_t count,
                    int64_t rows_per_band, float* cols, float* gcols) {
  const int64_t K = g.patch(), O = g.out_channels, n = count * g.pixels();
  auto gy_mat = unaligned_mat(gy, O, n);  // in place, gy is a sample of the tensor
  if (gbias) Eigen::Map<Eigen::VectorXf>(gbias, O) += gy_mat.rowwise().sum();
  if (count == 1 && columns_are_input(g)) {
    if (gw)
      gemm(O, K, n, {gy, n, /*transposed=*/false, /*streamed=*/true},
           {x + first * K * n, n, /*transposed=*/true}, gw, K, /*accumulate=*/true);
    if (gx)
      gemm_packed(K, n, O, w_transposed, {gy, n}, gx.data + first * K * n, n, /*accumulate=*/!gx.overwrite);
    return;
  }
  const float* split = gw ? split_for_im2col(g, x, first, count) : nullptr;
  for (int64_t row0 = 0; row0 < g.out_h; row0 += rows_per_band) {
    const Rows rows{first, count, row0, std::min(g.out_h, row0 + rows_per_band)};
    const int64_t columns = rows.columns(g);
    const float* band = gy + row0 * g.out_w;  // its rows n floats apart
    if (gw) {
      im2col(g, x, rows, split, cols);
      gemm(O, K, columns, {band, n, /*transposed=*/false, /*streamed=*/true},
           {cols, columns, /*transposed=*/true}, gw, K, /*accumulate=*/true);
    }
    if (gx) {
      gemm_packed(K, columns, O, w_transposed, {band, n}, gcols, columns, /*accumulate=*/false);
      col2im_add(g, gcols, rows, gx.data);
    }
  }
}

// Scratch of one chunk: the columns of a band of its rows unless the input serves (columns_are_input),
// its [O, chunk*P] product or output gradient unless the tensor itself serves, and the columns'
// gradient when the input's is wanted and cannot take it directly. Backward's W^T, packed once for all
// chunks.
struct ChunkBuffers {
  ChunkBuffers(const ConvGeometry& g, int64_t chunk, int64_t rows_per_band, bool input_gradient,
               bool outputs_in_place)
      : columns_in_place(chunk == 1 && columns_are_input(g)),
        cols(columns_in_place ? 0 : sizeof(float) * g.patch() * chunk * rows_per_band * g.out_w),
        outputs(outputs_in_place ? 0 : sizeof(float) * g.out_channels * chunk * g.pixels()),
        gcols(input_gradient && !columns_in_place
                  ? sizeof(float) * g.patch() * chunk * rows_per_band * g.out_w
                  : 0),
        packed_weights(input_gradient ? sizeof(float) * packed_left_floats(g.patch(), g.out_channels) : 0) {}
  bool columns_in_place;
  Storage cols, outputs, gcols, packed_weights;
};

// Pixel p of a plane laid out as it is: at p.
struct ContiguousPixels {
  int64_t operator[](int64_t p) const { return p; }
};

// g where the activation y > 0, else +0: ReLU's gradient by a mask rather than a branch, which
// mispredicts. Adding the +0 changes no sum (none is -0, as every sum starts from +0).
float masked_gradient(float g, float y) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(g) & -static_cast<uint32_t>(y > 0.0f));
}

// Sample's output gradient through ReLU's mask, as transpose reads it: rows of O channels by P pixels.
// The mask's bits are all ones where y > 0, none elsewhere (NaN included), as masked_gradient's.
struct MaskedPlanes {
  const float *go, *y;
  int64_t P;
  simd::Packet packet(int64_t o, int64_t p) const {
    const int64_t at = o * P + p;
    return Eigen::internal::pand(simd::load(go + at),
                                 Eigen::internal::pcmp_lt(simd::zero(), simd::load(y + at)));
  }
  float operator()(int64_t o, int64_t p) const { return masked_gradient(go[o * P + p], y[o * P + p]); }
};

// The output gradient of one sample, planes [O, P] (through ReLU's mask where y is given), into
// channels-last rows: pixel p's channels at to[offset_of[p] + o], through simd::transpose. (Float by
// float, this scatter was 1.4% of resnet18's step at 64x64; its 3x3/1 backward went from 71.8 to 68.6
// ms a step, ResNet-50's from 480 to 465, one AMD EPYC core.)
void planes_to_rows(const float* go, const float* y, int64_t O, int64_t P, const int64_t* offset_of,
                    float* to) {
  const auto to_row = [&](int64_t p) { return to + offset_of[p]; };
  if (y) return simd::transpose</*Add=*/false>(O, P, MaskedPlanes{go, y, P}, to_row);
  simd::transpose</*Add=*/false>(O, P, simd::Rows{[&](int64_t o) { return go + o * P; }}, to_row);
}

// The input gradient for kernels that add into it: one to be written starts from zeros.
// backward_with skips this where the GEMM writes the gradient itself (one-sample 1x1 chunks): there
// the zeros' stores, and the GEMM's reloading of them, are memory traffic that short products do not
// hide.
float* adding_into(GradientOut gx, const Conv2dGeometry& g) {
  if (gx.overwrite)
    std::memset(gx.data, 0,
                sizeof(float) * static_cast<std::size_t>(g.batch * g.channels * g.height * g.width));
  return gx.data;
}

// Backward: write_output_gradient(sample, base, offset_of, channel_stride) writes the conv output
// gradient of one sample, pixel p of channel o at base[offset_of[p] + o * channel_stride], all zero
// beforehand. Over the batch in chunks (the chunk's planes in [O, count*P] layout, then its GEMMs)
// unless the direct kernels take the geometry, in their own layout. `output_gradient`, when given, is
// what the writer would write, [batch, O, P]: one-sample chunks read it in place.
template <typename WriteOutputGradient>
void backward_with(const ConvGeometry& g, const float* x, const float* w, GradientOut gx, float* gw,
                   float* gbias, WriteOutputGradient write_output_gradient,
                   const float* output_gradient = nullptr) {
  if (winograd_conv::applies(g))
    return winograd_conv::backward(g, x, w, gx, gw, gbias, write_output_gradient);
  if (small_plane_conv::applies_backward(g))
    return small_plane_conv::backward(g, x, w, adding_into(gx, g), gw, gbias, write_output_gradient);
  if (direct_conv::applies_backward(g))
    return direct_conv::backward(g, x, w, adding_into(gx, g), gw, gbias, write_output_gradient);
  const int64_t P = g.pixels(), O = g.out_channels, chunk = chunk_samples(g, bool(gx));
  const int64_t rows_per_band = chunk == 1 ? band_rows(g, bool(gx)) : g.out_h;
  const bool gradient_in_place = output_gradient != nullptr && chunk == 1;
  ChunkBuffers buffers(g, chunk, rows_per_band, bool(gx), gradient_in_place);
  if (!buffers.columns_in_place) gx = GradientOut{adding_into(gx, g)};  // zeroed: added into from here on
  // Every chunk's input gradient multiplies by W^T: packed once here, not once a chunk (ResNet-50's
  // 1x1 layers over 56x56 and 28x28 run a chunk per sample).
  const PackedLeft w_transposed = gx ? pack_transposed_left(g.patch(), O, {w, g.patch(), /*transposed=*/true},
                                                            buffers.packed_weights.as<float>())
                                     : PackedLeft{};
  for (int64_t first = 0; first < g.batch; first += chunk) {
    const int64_t count = std::min(chunk, g.batch - first), n = count * P;
    const float* gy = gradient_in_place ? output_gradient + first * O * P : nullptr;
    if (!gradient_in_place) {
      float* written = buffers.outputs.as<float>();
      std::fill_n(written, O * n, 0.0f);
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < count; ++b)
        write_output_gradient(first + b, written + b * P, ContiguousPixels{}, n);
      gy = written;
    }
    chunk_backward(g, gy, x, w_transposed, gx, gw, gbias, first, count, rows_per_band,
                   buffers.cols.as<float>(), buffers.gcols.as<float>());
  }
}

// Forward: visit(sample, channel, plane) gets every plane of the convolution's sums (no bias), which
// it may overwrite. By the direct kernels, or else per chunk: W x the chunk's columns, [O, count*P].
// `output`, when given ([batch, O, P]), takes one-sample chunks' sums in place, so that their planes
// are the output's own.
template <typename Visit>
void forward_with(const ConvGeometry& g, const float* x, const float* w, Visit visit,
                  float* output = nullptr) {
  if (winograd_conv::applies(g)) return winograd_conv::forward(g, x, w, visit);
  if (small_plane_conv::applies(g)) return small_plane_conv::forward(g, x, w, visit);
  if (direct_conv::applies(g)) return direct_conv::forward(g, x, w, visit);
  const int64_t P = g.pixels(), O = g.out_channels, K = g.patch(), chunk = chunk_samples(g, false);
  const int64_t rows_per_band = chunk == 1 ? band_rows(g, false) : g.out_h;
  const bool output_in_place = output != nullptr && chunk == 1;
  ChunkBuffers buffers(g, chunk, rows_per_band, false, output_in_place);
  float* cols = buffers.cols.as<float>();
  for (int64_t first = 0; first < g.batch; first += chunk) {
    const int64_t count = std::min(chunk, g.batch - first), n = count * P;
    float* product = output_in_place ? output + first * O * P : buffers.outputs.as<float>();
    if (buffers.columns_in_place) {
      gemm(O, n, K, {w, K}, {x + first * K * n, n}, product, n, /*accumulate=*/false);
    } else {
      const float* split = split_for_im2col(g, x, first, count);
      for (int64_t row0 = 0; row0 < g.out_h; row0 += rows_per_band) {
        const Rows rows{first, count, row0, std::min(g.out_h, row0 + rows_per_band)};
        im2col(g, x, rows, split, cols);
        gemm(O, rows.columns(g), K, {w, K}, {cols, rows.columns(g)}, product + row0 * g.out_w, n,
             /*accumulate=*/false);
      }
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < count; ++b)
      for (int64_t o = 0; o < O; ++o) visit(first + b, o, product + o * n + b * P);
  }
}

}  // namespace

void conv2d(const float* x, const float* w, const float* bias, float* y, const Conv2dGeometry& g) {
  const int64_t P = g.pixels(), O = g.out_channels;
  forward_with(
      g, x, w,
      [&](int64_t sample, int64_t o, const float* sums) {
        float* to = y + (sample * O + o) * P;
        if (sums == to && !bias && !g.fuse_relu) return;  // the sums already are the output
        const float add = bias ? bias[o] : 0.0f;
        if (g.fuse_relu) {
          for (int64_t p = 0; p < P; ++p) to[p] = relu_of(sums[p] + add);
        } else {
          for (int64_t p = 0; p < P; ++p) to[p] = sums[p] + add;
        }
      },
      y);
}

void conv2d_backward(const float* go, const float* x, const float* w, const float* y, GradientOut gx,
                     float* gw, float* gbias, const Conv2dGeometry& g) {
  const int64_t P = g.pixels(), O = g.out_channels;
  // [batch, O, P] -> the layout the backward kernels read (through ReLU's mask if fused).
  backward_with(
      g, x, w, gx, gw, gbias,
      [&](int64_t sample, float* to, auto offset_of, int64_t channel_stride) {
        if constexpr (std::is_pointer_v<decltype(offset_of)>) {
          if (channel_stride == 1)
            return planes_to_rows(go + sample * O * P, g.fuse_relu ? y + sample * O * P : nullptr, O, P,
                                  offset_of, to);
        }
        for (int64_t o = 0; o < O; ++o) {
          const int64_t at = (sample * O + o) * P;
          float* plane = to + o * channel_stride;
          if (g.fuse_relu) {
            for (int64_t p = 0; p < P; ++p) plane[offset_of[p]] = masked_gradient(go[at + p], y[at + p]);
          } else {
            for (int64_t p = 0; p < P; ++p) plane[offset_of[p]] = go[at + p];
          }
        }
      },
      g.fuse_relu ? nullptr : go);  // unmasked, the output gradient is what the writer writes
}

void conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y, int32_t* argmax,
                         const ConvPoolGeometry& geometry) {
  const Conv2dGeometry& g = geometry.conv;
  const int64_t P = g.pixels(), O = g.out_channels;
  const int64_t pooled = geometry.pool.out_h * geometry.pool.out_w;
  DPTRAIN_CHECK(g.fuse_relu, "conv2d_relu_maxpool: the geometry must have fuse_relu set");
  // Bias and ReLU in place (the same arithmetic as conv2d's), then the plane's pooling.
  forward_with(g, x, w, [&](int64_t sample, int64_t o, float* plane) {
    const float add = bias ? bias[o] : 0.0f;
    for (int64_t p = 0; p < P; ++p) plane[p] = relu_of(plane[p] + add);
    const int64_t at = (sample * O + o) * pooled;
    maxpool2d_plane(plane, y + at, argmax ? argmax + at : nullptr, geometry.pool);
  });
}

void conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y, const float* x,
                                  const float* w, GradientOut gx, float* gw, float* gbias,
                                  const ConvPoolGeometry& geometry) {
  const int64_t O = geometry.conv.out_channels;
  const int64_t pooled = geometry.pool.out_h * geometry.pool.out_w;
  // Each window's gradient goes to its winner where the pooled value (the winner's ReLU output) is
  // positive, in maxpool2d_backward's order.
  backward_with(geometry.conv, x, w, gx, gw, gbias,
                [&](int64_t sample, float* to, auto offset_of, int64_t channel_stride) {
                  for (int64_t o = 0; o < O; ++o) {
                    const int64_t at = (sample * O + o) * pooled;
                    float* plane = to + o * channel_stride;
                    for (int64_t j = 0; j < pooled; ++j)
                      plane[offset_of[argmax[at + j]]] += masked_gradient(gy[at + j], y[at + j]);
                  }
                });
}

}  // namespace dptrain::cpu
