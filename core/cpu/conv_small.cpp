// Convolutions over small planes as one GEMM per tap and run of pixels. Tap t = (kh, kw) links output
// pixel (oh, ow) to input pixel (oh s - pad + kh, ow s - pad + kw) at stride s where that lies inside
// the plane; along an output row the pixels it links form one run, and so do their inputs (at stride
// 2 once the input's copies hold its even and odd rows and columns apart: InputSlots). With the pixels
// outermost in copies of the activations, a run is a block of whole rows or columns of a matrix:
//   forward          Y[o, (p, b)]  += W_t[o, c] X[c, (q, b)]     (activations [channel, pixel, sample])
//   input gradient   GX[(q, b), c] += GY[(p, b), o] W_t[o, c]     ([pixel, sample, channel])
//   weight gradient  GW_t[o, c]    += GY[o, (p, b)] X[(q, b), c]
// so only products with pixels inside the plane are made, where im2col multiplies the padding's zeros
// too (20 of every 36 products at 3x3 over 2x2 planes: ResNet-18's last stage at 64x64 input). The
// copies are of activations, a few hundred KiB at these planes, and of the weights, once per call
// into [tap, out, in], the one layout that both the forward (as A, read in place) and the input
// gradient (as B, whose blocks the GEMM copies from contiguous rows) take without a transpose.
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
// resnet50's step 10.6 s of kernels against 11.0. On the Intel Xeon kind (AVX-512, one core), with
// the transposes below in registers (2026-12-06), these kernels won the backward up to 0.91 inside
// and lost it above (ms a call, against the direct kernels or im2col): ResNet-50's 512 over 7x7 (0.82)
// at batch 16 53 against 74, its 256 over 14x14 (0.907) 61 against 70-80; resnet18's 128 over 8x8
// (0.84) at batch 32 8.4 against 11.1, its 64 over 16x16 (0.918) 12.9 against 10.0. Those have not
// been timed on the AMD kind since its 8x8 figure above.
constexpr double kForwardShare = 0.9;
constexpr double kBackwardShare = simd::kLanes >= 16 ? 0.91 : 0.95;
// At stride 2 the other way is im2col, whose copies at stride 2 go float by float. On the Intel Xeon
// kind, one core, 3x3/2 layers with padding 1 over even planes (the share inside is 0.69 over 2x2
// outputs, 0.84 over 4x4, 0.907 over 7x7, 0.918 over 8x8, 0.953 over 14x14, 0.959 over 16x16, 0.976
// over 28x28; 16x16 and 128-512 channels were not timed, nor fewer channels), ms per call forward and
// backward, im2col -> per tap: resnet18's at 64x64, batch 32: 64->128 over 8x8 3.20 -> 3.05 and 6.70
// -> 7.99, 128->256 over 4x4 3.10 -> 2.30 and 6.22 -> 5.26, 256->512 over 2x2 3.11 -> 2.32 and 6.96 ->
// 5.19; ResNet-50's at batch 16: 512 over 7x7 35.4 -> 28.6 and 69.1 -> 65.6, 256 over 14x14 35.9 ->
// 33.1 and 71.8 -> 131.0, 128 over 28x28 35.5 -> 45.9 and 77.3 -> 226.0.
constexpr double kStridedForwardShare = 0.955;
constexpr double kStridedBackwardShare = 0.915;
// Output channels per thread in the forward come in multiples of this (the GEMM's row block).
constexpr int64_t kRowMultiple = 16;

// Outputs [first_output, + length) of a plane take tap `tap` from inputs [first_input, + length).
struct Run {
  int64_t tap, first_output, first_input, length;
};

// Where input pixel (ih, iw) sits in the copies of the input: at stride s its phase (ih % s, iw % s)
// first, then (ih / s, iw / s) in a plane of ceil(H / s) x ceil(W / s), so that the inputs of a tap's
// run, s apart in the plane, are neighbours here as they are at stride 1 (where this is ih * W + iw).
// Slots of a phase past the plane's edge are read by no run.
struct InputSlots {
  int64_t stride, rows, cols;  // the phase planes' size
  explicit InputSlots(const Conv2dGeometry& g)
      : stride(g.stride),
        rows((g.height + g.stride - 1) / g.stride),
        cols((g.width + g.stride - 1) / g.stride) {}
  int64_t count() const { return stride * stride * rows * cols; }
  int64_t operator()(int64_t ih, int64_t iw) const {
    return ((ih % stride) * stride + iw % stride) * rows * cols + (ih / stride) * cols + iw / stride;
  }
};

// The runs of every tap in tap order, one per output row, or one per block of rows where the tap
// links whole rows to whole rows (the middle column of taps when out_w == width at stride 1, the taps
// of even columns when out_w == ceil(width / 2) at stride 2).
std::vector<Run> runs_of(const Conv2dGeometry& g) {
  const InputSlots slot(g);
  const auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); };
  std::vector<Run> runs;
  for (int64_t kh = 0; kh < g.kernel_h; ++kh)
    for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
      const int64_t tap = kh * g.kernel_w + kw;
      // Input column ow * stride - pad + kw in [0, width).
      const int64_t ow0 = std::clamp<int64_t>(ceil_div(g.padding - kw, g.stride), 0, g.out_w);
      const int64_t ow1 = std::clamp<int64_t>(ceil_div(g.width + g.padding - kw, g.stride), ow0, g.out_w);
      if (ow0 == ow1) continue;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t ih = oh * g.stride - g.padding + kh;
        if (ih < 0 || ih >= g.height) continue;
        const int64_t p = oh * g.out_w + ow0, q = slot(ih, ow0 * g.stride - g.padding + kw);
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
// The slot of every input pixel, in the pixels' order.
std::vector<int64_t> slots_of_pixels(const Conv2dGeometry& g) {
  const InputSlots slot(g);
  std::vector<int64_t> slots;
  for (int64_t ih = 0; ih < g.height; ++ih)
    for (int64_t iw = 0; iw < g.width; ++iw) slots.push_back(slot(ih, iw));
  return slots;
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

}  // namespace

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

namespace {

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

// x [B, C, Q] -> [C, S, B] (ChannelMajor) or [S, B, C], S the input slots (InputSlots): each row
// x[b, c] read once, its Q floats written to Q places that move on together.
template <bool ChannelMajor>
const float* input_by_slot(const Conv2dGeometry& g, const float* x, const std::vector<int64_t>& slots) {
  const int64_t B = g.batch, C = g.channels, Q = input_pixels(g), S = InputSlots(g).count();
  const int64_t* slot = slots.data();
  float* to = thread_scratch<kInput>(B * C * S);
  if constexpr (!ChannelMajor) {
    // Sample b's [C, Q] transposed into rows slot[q] * B + b (at C floats).
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; ++b)
      simd::transpose</*Add=*/false>(C, Q, simd::Rows{[&](int64_t c) { return x + (b * C + c) * Q; }},
                                     [&](int64_t q) { return to + (slot[q] * B + b) * C; });
    return to;
  }
  // Channel c's [B, Q] transposed into rows c * S + slot[q].
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c)
    simd::transpose</*Add=*/false>(B, Q, simd::Rows{[&](int64_t b) { return x + (b * C + c) * Q; }},
                                   [&](int64_t q) { return to + (c * S + slot[q]) * B; });
  return to;
}

// The share of im2col's tap-pixel products that meet a pixel inside the plane; 1 where these kernels
// do not apply at all.
double share_inside(const Conv2dGeometry& g) {
  if (g.stride > 2 || taps(g) == 1 || g.channels < kMinChannels || g.out_channels < kMinChannels) return 1.0;
  int64_t products = 0;
  for (const Run& run : runs_of(g)) products += run.length;
  return static_cast<double>(products) / static_cast<double>(taps(g) * g.pixels());
}

}  // namespace

bool applies(const Conv2dGeometry& g) {
  return share_inside(g) < (g.stride == 1 ? kForwardShare : kStridedForwardShare);
}

bool applies_backward(const Conv2dGeometry& g) {
  return share_inside(g) < (g.stride == 1 ? kBackwardShare : kStridedBackwardShare);
}

void forward(const Conv2dGeometry& g, const float* x, const float* w,
             const direct_conv::PlaneVisitor& visit) {
  const std::vector<Run> runs = runs_of(g);
  const int64_t B = g.batch, C = g.channels, O = g.out_channels, P = g.pixels(), S = InputSlots(g).count();
  const float* by_tap = weights_by_tap(g, w);
  const float* input = input_by_slot<true>(g, x, slots_of_pixels(g));
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
           {input + run.first_input * B, S * B}, sums + o0 * P * B + run.first_output * B, P * B,
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
  const int64_t S = InputSlots(g).count(), T = taps(g);
  const std::vector<int64_t> slots = slots_of_pixels(g);
  const int64_t* slot = slots.data();
  // The output gradient as [P, B, O], written into zeros.
  float* by_pixel = thread_scratch<kGradientByPixel>(P * B * O);
  std::fill_n(by_pixel, P * B * O, 0.0f);
  std::vector<int64_t> offset_of(static_cast<std::size_t>(P));
  for (int64_t p = 0; p < P; ++p) offset_of[static_cast<std::size_t>(p)] = p * B * O;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b) write_output_gradient(b, by_pixel + b * O, offset_of.data(), 1);

  if (gx) {
    const float* by_tap = weights_by_tap(g, w);
    float* sums = thread_scratch<kInputGradient>(S * B * C);
    std::fill_n(sums, S * B * C, 0.0f);
    for (const Run& run : runs)
      gemm(run.length * B, C, O, {by_pixel + run.first_output * B * O, O}, {by_tap + run.tap * O * C, C},
           sums + run.first_input * B * C, C, /*accumulate=*/true);
      // Rows slot[q] * B + b of the sums, sample b's [Q, C], added transposed into its [C, Q].
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; ++b)
      simd::transpose</*Add=*/true>(Q, C, simd::Rows{[&](int64_t q) { return sums + (slot[q] * B + b) * C; }},
                                    [&](int64_t c) { return gx + (b * C + c) * Q; });
  }
  if (!gw && !gbias) return;
  // ... and as [O, P, B], each channel's gradients a row.
  float* by_channel = thread_scratch<kGradientByChannel>(O * P * B);
  // In blocks of kLanes output channels, the threads' share.
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < O; o0 += kLanes)
    simd::transpose</*Add=*/false>(P * B, std::min(kLanes, O - o0),
                                   simd::Rows{[&](int64_t i) { return by_pixel + i * O + o0; }},
                                   [&](int64_t o) { return by_channel + (o0 + o) * P * B; });
  if (gbias)
    for (int64_t o = 0; o < O; ++o) {
      float sum = 0.0f;
      for (int64_t i = 0; i < P * B; ++i) sum += by_channel[o * P * B + i];
      gbias[o] += sum;
    }
  if (!gw) return;
  const float* input = input_by_slot<false>(g, x, slots);
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
