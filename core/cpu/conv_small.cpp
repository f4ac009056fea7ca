// Convolutions at stride 1 over small planes as one GEMM per tap and run of pixels. Tap t = (kh, kw)
// links output pixel (oh, ow) to input pixel (oh - pad + kh, ow - pad + kw) where that lies inside the
// plane; along an output row the pixels it links form one run, and so do their inputs. With the pixels
// outermost in copies of the activations, a run is a block of whole rows or columns of a matrix:
//   forward          Y[o, (p, b)]  += W_t[o, c] X[c, (q, b)]     (activations [channel, pixel, sample])
//   input gradient   GX[(q, b), c] += GY[(p, b), o] W_t[o, c]     ([pixel, sample, channel])
//   weight gradient  GW_t[o, c]    += GY[o, (p, b)] X[(q, b), c]
// so only products with pixels inside the plane are made, where im2col multiplies the padding's zeros
// too (20 of every 36 products at 3x3 over 2x2 planes: ResNet-18's last stage at 64x64 input). The
// copies are of activations, a few hundred KiB at these planes, and of the weights, once per call
// into [tap, out, in], the one layout that both the forward (as A) and the input gradient (as B) read
// in place.
#include "core/cpu/conv_small.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/cpu/gemm.h"
#include "core/cpu/packet.h"

namespace dptrain::cpu::small_plane_conv {
namespace {

using simd::thread_scratch;

// Channels below this leave GEMMs too small to pay for the copies.
constexpr int64_t kMinChannels = 16;
// Below these shares of the products inside the plane, forward and backward take these kernels (3x3
// layers, one AMD EPYC core: the forward of resnet18's 128 channels over 8x8 ran in 7.9 ms a step
// here, 9.9 direct, that of resnet50's 512 over 7x7 in 28 against 38, its 64 over 16x16, 92% inside,
// in 14.4 against 11.5; backward at 8x8 took 24.2 ms against 20.6 direct). That core had AVX-512.
// With AVX2 (a Zen 3 core) these kernels win the backward up to 95% inside: resnet18's 128 channels
// over 8x8 took 63 ms a step against 148 through im2col, its 64 over 16x16 125 against 142-159, and
// resnet50's step 10.6 s of kernels against 11.0.
constexpr double kForwardShare = 0.9;
constexpr double kBackwardShare = simd::kLanes >= 16 ? 0.75 : 0.95;
// Output channels per thread in the forward come in multiples of this (the GEMM's row block).
constexpr int64_t kRowMultiple = 16;

// Outputs [first_output, + length) of a plane take tap `tap` from inputs [first_input, + length).
struct Run {
  int64_t tap, first_output, first_input, length;
};

// The runs of every tap in tap order, one per output row, or one per block of rows where the tap
// links whole rows to whole rows (the middle column of taps when out_w == width).
std::vector<Run> runs_of(const Conv2dGeometry& g) {
  std::vector<Run> runs;
  for (int64_t kh = 0; kh < g.kernel_h; ++kh)
    for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
      const int64_t tap = kh * g.kernel_w + kw;
      // Input column ow - pad + kw in [0, width).
      const int64_t ow0 = std::clamp<int64_t>(g.padding - kw, 0, g.out_w);
      const int64_t ow1 = std::clamp<int64_t>(g.width + g.padding - kw, ow0, g.out_w);
      if (ow0 == ow1) continue;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t ih = oh - g.padding + kh;
        if (ih < 0 || ih >= g.height) continue;
        const int64_t p = oh * g.out_w + ow0, q = ih * g.width + ow0 - g.padding + kw;
        Run* last = runs.empty() ? nullptr : &runs.back();
        if (last && last->tap == tap && last->first_output + last->length == p &&
            last->first_input + last->length == q) {
          last->length += ow1 - ow0;
        } else {
          runs.push_back({tap, p, q, ow1 - ow0});
        }
      }
    }
  return runs;
}

int64_t taps(const Conv2dGeometry& g) {
  return g.kernel_h * g.kernel_w;
}
int64_t input_pixels(const Conv2dGeometry& g) {
  return g.height * g.width;
}

enum Slot {
  kWeightsByTap,
  kInput,
  kSums,
  kPlane,
  kGradientByPixel,
  kGradientByChannel,
  kInputGradient,
  kWeightGradient
};

using simd::Block;
using simd::kLanes;
using simd::Packet;

// Whether the block of kLanes input channels from c0 goes through registers (below): T <= kLanes,
// and its last packet's kLanes floats inside the output channel's C * T (another thread's otherwise).
bool in_registers(const Conv2dGeometry& g, int64_t c0) {
  const int64_t T = taps(g);
  return T <= kLanes && (c0 + kLanes - 1) * T + kLanes <= g.channels * T;
}

// w [O, C, T] -> [T, O, C]. With T <= kLanes, in blocks of kLanes input channels: their T taps each
// (contiguous) loaded as kLanes packets, the first T floats of each counting, then transposed in
// registers, so that packet t holds tap t of the block's channels. (A scalar loop copied the weights
// at about a cycle a float: 3% of resnet18's step at 64x64, for this copy and the one back below.)
const float* weights_by_tap(const Conv2dGeometry& g, const float* w) {
  const int64_t T = taps(g), O = g.out_channels, C = g.channels;
  float* by_tap = thread_scratch<kWeightsByTap>(T * O * C);
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < O; ++o) {
    int64_t c0 = 0;
    for (; in_registers(g, c0); c0 += kLanes) {
      Block block;
      for (int64_t i = 0; i < kLanes; ++i) block.packet[i] = simd::load(w + (o * C + c0 + i) * T);
      Eigen::internal::ptranspose(block);
      for (int64_t t = 0; t < T; ++t) simd::pstoreu(by_tap + (t * O + o) * C + c0, block.packet[t]);
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = c0; c < C; ++c) by_tap[(t * O + o) * C + c] = w[(o * C + c) * T + t];
  }
  return by_tap;
}

// gw [O, C, T] += by_tap [T, O, C], the reverse in the same blocks. After the transpose, packet i
// holds channel c0 + i's T taps in its first T lanes; stored one after the other T floats apart (each
// store's lanes past T overwritten by the next) they make the block's kLanes * T floats of gw, which
// then take their sums as T whole packets. (Added into gw directly, each packet overlapping the
// next, every load waited on the store before it: resnet18's 3x3 backward over 2x2 planes took 15.2
// ms a step, 14.0 now, one AMD EPYC core.)
void add_weight_gradient(const Conv2dGeometry& g, const float* by_tap, float* gw) {
  const int64_t T = taps(g), O = g.out_channels, C = g.channels;
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < O; ++o) {
    alignas(64) float staged[(kLanes + 1) * kLanes];
    int64_t c0 = 0;
    for (; in_registers(g, c0); c0 += kLanes) {
      Block block;
      for (int64_t t = 0; t < kLanes; ++t)
        block.packet[t] = t < T ? simd::load(by_tap + (t * O + o) * C + c0) : simd::zero();
      Eigen::internal::ptranspose(block);
      for (int64_t i = 0; i < kLanes; ++i) simd::pstoreu(staged + i * T, block.packet[i]);
      float* at = gw + (o * C + c0) * T;
      for (int64_t p = 0; p < T; ++p)
        simd::pstoreu(at + p * kLanes,
                      simd::padd(simd::load(at + p * kLanes), simd::load(staged + p * kLanes)));
    }
    for (int64_t c = c0; c < C; ++c)
      for (int64_t t = 0; t < T; ++t) gw[(o * C + c) * T + t] += by_tap[(t * O + o) * C + c];
  }
}

// x [B, C, Q] -> [C, Q, B] (ChannelMajor) or [Q, B, C]: each row x[b, c] read once, its Q floats
// written to Q places that move on together.
template <bool ChannelMajor>
const float* input_by_pixel(const Conv2dGeometry& g, const float* x) {
  const int64_t B = g.batch, C = g.channels, Q = input_pixels(g);
  float* to = thread_scratch<kInput>(B * C * Q);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t outer = 0; outer < (ChannelMajor ? C : B); ++outer)
    for (int64_t inner = 0; inner < (ChannelMajor ? B : C); ++inner) {
      const int64_t c = ChannelMajor ? outer : inner, b = ChannelMajor ? inner : outer;
      for (int64_t q = 0; q < Q; ++q)
        to[ChannelMajor ? (c * Q + q) * B + b : (q * B + b) * C + c] = x[(b * C + c) * Q + q];
    }
  return to;
}

// The share of im2col's tap-pixel products that meet a pixel inside the plane; 1 where these kernels
// do not apply at all.
double share_inside(const Conv2dGeometry& g) {
  if (g.stride != 1 || taps(g) == 1 || g.channels < kMinChannels || g.out_channels < kMinChannels) return 1.0;
  int64_t products = 0;
  for (const Run& run : runs_of(g)) products += run.length;
  return static_cast<double>(products) / static_cast<double>(taps(g) * g.pixels());
}

}  // namespace

bool applies(const Conv2dGeometry& g) {
  return share_inside(g) < kForwardShare;
}

bool applies_backward(const Conv2dGeometry& g) {
  return share_inside(g) < kBackwardShare;
}

void forward(const Conv2dGeometry& g, const float* x, const float* w,
             const direct_conv::PlaneVisitor& visit) {
  const std::vector<Run> runs = runs_of(g);
  const int64_t B = g.batch, C = g.channels, O = g.out_channels, P = g.pixels(), Q = input_pixels(g);
  const float* by_tap = weights_by_tap(g, w);
  const float* input = input_by_pixel<true>(g, x);
  float* sums = thread_scratch<kSums>(O * P * B);
  // Each thread takes a block of output channels through every run; nested, the GEMM runs on the
  // thread that calls it (its own parallel loop is over columns, here at most a plane of samples).
#pragma omp parallel
  {
    const int64_t share = (O + omp_get_num_threads() - 1) / omp_get_num_threads();
    const int64_t rows = (share + kRowMultiple - 1) / kRowMultiple * kRowMultiple;
    const int64_t o0 = std::min(O, omp_get_thread_num() * rows), o1 = std::min(O, o0 + rows);
    std::fill(sums + o0 * P * B, sums + o1 * P * B, 0.0f);
    for (const Run& run : runs)  // a thread without channels calls it with no rows: a no-op
      gemm(o1 - o0, run.length * B, C, {by_tap + (run.tap * O + o0) * C, C},
           {input + run.first_input * B, Q * B}, sums + o0 * P * B + run.first_output * B, P * B,
           /*accumulate=*/true);
    float* plane = thread_scratch<kPlane>(P);
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t p = 0; p < P; ++p) plane[p] = sums[(o * P + p) * B + b];
        visit(b, o, plane);
      }
  }
}

void backward(const Conv2dGeometry& g, const float* x, const float* w, float* gx, float* gw, float* gbias,
              const direct_conv::GradientWriter& write_output_gradient) {
  const std::vector<Run> runs = runs_of(g);
  const int64_t B = g.batch, C = g.channels, O = g.out_channels, P = g.pixels(), Q = input_pixels(g);
  const int64_t T = taps(g);
  // The output gradient as [P, B, O], written into zeros.
  float* by_pixel = thread_scratch<kGradientByPixel>(P * B * O);
  std::fill_n(by_pixel, P * B * O, 0.0f);
  std::vector<int64_t> offset_of(static_cast<std::size_t>(P));
  for (int64_t p = 0; p < P; ++p) offset_of[static_cast<std::size_t>(p)] = p * B * O;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b) write_output_gradient(b, by_pixel + b * O, offset_of.data(), 1);

  if (gx) {
    const float* by_tap = weights_by_tap(g, w);
    float* sums = thread_scratch<kInputGradient>(Q * B * C);
    std::fill_n(sums, Q * B * C, 0.0f);
    for (const Run& run : runs)
      gemm(run.length * B, C, O, {by_pixel + run.first_output * B * O, O}, {by_tap + run.tap * O * C, C},
           sums + run.first_input * B * C, C, /*accumulate=*/true);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t q = 0; q < Q; ++q) gx[(b * C + c) * Q + q] += sums[(q * B + b) * C + c];
  }
  if (!gw && !gbias) return;
  // ... and as [O, P, B], each channel's gradients a row.
  float* by_channel = thread_scratch<kGradientByChannel>(O * P * B);
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < P * B; ++i) by_channel[o * P * B + i] = by_pixel[i * O + o];
  if (gbias)
    for (int64_t o = 0; o < O; ++o) {
      float sum = 0.0f;
      for (int64_t i = 0; i < P * B; ++i) sum += by_channel[o * P * B + i];
      gbias[o] += sum;
    }
  if (!gw) return;
  const float* input = input_by_pixel<false>(g, x);
  float* sums = thread_scratch<kWeightGradient>(T * O * C);
  for (int64_t t = 0; t < T; ++t) {
    bool reached = false;  // the first run of a tap writes its sums, the later ones add
    for (const Run& run : runs) {
      if (run.tap != t) continue;
      gemm(O, C, run.length * B, {by_channel + run.first_output * B, P * B},
           {input + run.first_input * B * C, C}, sums + t * O * C, C, /*accumulate=*/reached);
      reached = true;
    }
    if (!reached) std::fill_n(sums + t * O * C, O * C, 0.0f);
  }
  add_weight_gradient(g, sums, gw);
}

}  // namespace dptrain::cpu::small_plane_conv
