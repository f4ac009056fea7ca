// Direct convolution at stride 1, without im2col. Forward reads the padded input planes as one flat
// array of row stride Wp, where output pixel (oh, ow) sits at index oh * Wp + ow and its tap (c, kh,
// kw) at that index plus c * plane + kh * Wp + kw: every tap is a contiguous shifted read, so one
// load of a packet of outputs' inputs serves a block of output channels whose weights are broadcast.
// The Wp - out_w columns of each row past out_w are computed and dropped (2 of 13 in the MNIST CNN's
// second layer), the price of loads without gathers. Backward writes the output gradient once,
// channels last, and both gradients read it with the channels in the lanes: the weight gradient
// broadcasts an input value against a packet of output gradients, the input gradient an output
// gradient against a packet of (transposed) weights, so that their accumulators, not im2col's
// columns, stay where the arithmetic is.
#include "core/cpu/conv_direct.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "core/cpu/packet.h"

namespace dptrain::cpu::direct_conv {
namespace {

using namespace simd;

// Buffers of the calling thread that outlive a call (simd::thread_scratch), one per slot.
enum Scratch {
  kInput,
  kGrids,
  kPlane,
  kGrads,
  kInputs,
  kWeightSums,
  kBiasSums,
  kInputGradientWeights,
  kInputGradientOut
};
template <Scratch Slot>
float* zeroed_scratch(int64_t floats) {
  float* buffer = thread_scratch<Slot>(floats);
  std::fill_n(buffer, floats, 0.0f);
  return buffer;
}

// Register blocks. Every output is one chain of multiply-adds in a fixed order whatever block it
// falls in, so the blocking changes speed, never bits. With AVX-512's 32 registers: 16 accumulators
// forward, 24 in either gradient. AVX2 has 16, and those blocks spilled (with its loads of inputs
// and a broadcast, the forward's 8 x 2 needed 19): there at most 12 accumulators, which leave room.
constexpr bool kWideRegisterFile = kVectorRegisters >= 32;
constexpr int64_t kShortPatch = 32;  // inputs per output (C * KH * KW) too few for a GEMM to pay
// Output channels per pass over a sample, two packets of pixels each.
constexpr int kForwardChannels = kWideRegisterFile ? 8 : 6;
constexpr int kGradientPackets = 4;  // output channels per weight-gradient pass: 4 packets
constexpr int kGradientTaps = 12;    // most taps per weight-gradient pass
// Taps per weight-gradient pass for 1..4 packets of channels.
constexpr std::array<int64_t, kGradientPackets> kTapsPerPass =
    kWideRegisterFile ? std::array<int64_t, kGradientPackets>{12, 12, 8, 6}
                      : std::array<int64_t, kGradientPackets>{12, 6, 4, 3};
constexpr int64_t kChunkFloats = 128 * 1024;  // 512 KiB: half of this machine's L2 per core
// Pixels per input-gradient pass for 1..4 packets of input channels: the same accumulator counts.
constexpr std::array<int64_t, kGradientPackets> kInputPixels = kTapsPerPass;

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// Packets of a pass over channels [c0, channels) (channels a whole number of packets): at most
// kGradientPackets, the channel blocking of both gradients.
int64_t packets_from(int64_t c0, int64_t channels) {
  return std::min<int64_t>(kGradientPackets, (channels - c0) / kLanes);
}

struct Layout {
  int64_t row;                   // Wp = width + 2 * padding
  int64_t plane;                 // Hp * Wp
  int64_t grid;                  // out_h * Wp outputs, rounded up to whole packets
  int64_t input_floats;          // the padded input and the slack that the last packets read past it
  std::vector<int64_t> offsets;  // per tap k = (c, kh, kw) of the patch: c * plane + kh * Wp + kw
};

Layout layout_of(const Conv2dGeometry& g) {
  Layout l;
  l.row = g.width + 2 * g.padding;
  l.plane = (g.height + 2 * g.padding) * l.row;
  l.grid = round_up(g.out_h * l.row, kLanes);
  // The last read ends before grid + the largest offset <= channels * plane + kernel_w + kLanes,
  // since out_h + kernel_h - 1 = Hp at stride 1.
  l.input_floats = g.channels * l.plane + g.kernel_w + kLanes;
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) l.offsets.push_back(c * l.plane + kh * l.row + kw);
  return l;
}

// Copies sample x [C, H, W] inside the padding of `input`, whose padding and slack stay zero.
void pad_sample(const Conv2dGeometry& g, const Layout& l, const float* x, float* input) {
  if (g.padding == 0) {
    std::memcpy(input, x, sizeof(float) * g.channels * g.height * g.width);
    return;
  }
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t h = 0; h < g.height; ++h)
      std::memcpy(input + c * l.plane + (h + g.padding) * l.row + g.padding, x + (c * g.height + h) * g.width,
                  sizeof(float) * g.width);
}

// Grid rows (stride Wp) -> a plane [out_h, out_w], in whole packets rather than a call to memcpy per
// short row: a row's last packet runs on into the next row's place, which the next row overwrites.
// Both buffers need kLanes floats of slack.
void grid_to_plane(const Conv2dGeometry& g, const Layout& l, const float* grid, float* plane) {
  for (int64_t oh = 0; oh < g.out_h; ++oh)
    for (int64_t ow = 0; ow < g.out_w; ow += kLanes)
      pstoreu(plane + oh * g.out_w + ow, load(grid + oh * l.row + ow));
}

template <typename Kernel, std::size_t... Index>
constexpr auto table_of(std::index_sequence<Index...>, auto make) {
  return std::array<Kernel, sizeof...(Index)>{make.template operator()<static_cast<int>(Index) + 1>()...};
}

// out[c, i .. i + Packets * kLanes) = sum over k < patch of w[c, k] * input[offsets[k] + i ...], for
// `Channels` output channels. Each output is one chain of fused multiply-adds in k order, whatever
// block it falls in.
template <int Channels, int Packets>
void forward_step(const float* input, const int64_t* offsets, int64_t patch, const float* w, int64_t length,
                  int64_t i, float* out) {
  Packet sums[Channels][Packets];
  for (auto& packets : sums)
    for (Packet& sum : packets) sum = zero();
  for (int64_t k = 0; k < patch; ++k) {
    const float* in = input + offsets[k] + i;
    Packet x[Packets];
    for (int p = 0; p < Packets; ++p) x[p] = load(in + p * kLanes);
    for (int c = 0; c < Channels; ++c) {
      const Packet weight = pset1<Packet>(w[c * patch + k]);
      for (int p = 0; p < Packets; ++p) sums[c][p] = pmadd(weight, x[p], sums[c][p]);
    }
  }
  for (int c = 0; c < Channels; ++c)
    for (int p = 0; p < Packets; ++p) pstoreu(out + c * length + i + p * kLanes, sums[c][p]);
}

// forward_step over i < length (a multiple of kLanes), two packets at a time.
template <int Channels>
void forward_block(const float* input, const int64_t* offsets, int64_t patch, const float* w, int64_t length,
                   float* out) {
  int64_t i = 0;
  for (; i + 2 * kLanes <= length; i += 2 * kLanes)
    forward_step<Channels, 2>(input, offsets, patch, w, length, i, out);
  if (i < length) forward_step<Channels, 1>(input, offsets, patch, w, length, i, out);
}

// All output channels: forward_block over blocks of kForwardChannels.
void forward_channels(const float* input, const std::vector<int64_t>& offsets, const float* w,
                      int64_t channels, int64_t length, float* out) {
  using Kernel = void (*)(const float*, const int64_t*, int64_t, const float*, int64_t, float*);
  static constexpr auto kKernels = table_of<Kernel>(std::make_index_sequence<kForwardChannels>(),
                                                    []<int N>() { return &forward_block<N>; });
  const int64_t patch = static_cast<int64_t>(offsets.size());
  for (int64_t c = 0; c < channels; c += kForwardChannels) {
    const int64_t block = std::min<int64_t>(kForwardChannels, channels - c);
    kKernels[block - 1](input, offsets.data(), patch, w + c * patch, length, out + c * length);
  }
}

// Input-gradient passes cover whole blocks of pixels, whose size depends on the packets of input
// channels per pass.
int64_t input_pixel_multiple(int64_t in_channels) {
  const int64_t channels = round_up(in_channels, kLanes);
  int64_t multiple = 1;
  for (int64_t c0 = 0; c0 < channels; c0 += kGradientPackets * kLanes)
    multiple = std::lcm(multiple, kInputPixels[packets_from(c0, channels) - 1]);
  return multiple;
}

// The output gradient of a chunk of samples, channels last: per sample, rows of `channels` floats
// (out_channels rounded up to whole packets) for `margin` zero rows, then the output grid (pixel (oh,
// ow) at row margin + oh * Wp + ow, the columns past out_w zero), then zero rows to `rows`. The writer
// fills it in place; the zero rows let the input gradient read shifted rows without bounds.
struct GradientLayout {
  GradientLayout(const Conv2dGeometry& g, const Layout& l)
      : channels(round_up(g.out_channels, kLanes)),
        margin((g.kernel_h - 1) * l.row + g.kernel_w - 1),
        input_rows(round_up(l.plane, input_pixel_multiple(g.channels))),
        rows(margin + input_rows) {
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow) offset_of.push_back((margin + oh * l.row + ow) * channels);
  }
  int64_t channels;
  int64_t margin;
  int64_t input_rows;  // the padded input's pixels, rounded up to whole blocks of the input gradient
  int64_t rows;
  std::vector<int64_t> offset_of;  // pixel oh * out_w + ow -> its float in a sample's rows
  int64_t sample_floats() const { return rows * channels; }
};

struct GradientChunk {
  const Conv2dGeometry* geometry;
  const Layout* layout;
  const GradientLayout* gradient;
  int64_t samples;
  const float* grads;   // [samples, gradient->rows, gradient->channels]
  const float* inputs;  // [samples, layout->input_floats]
};

// Lanes (output channels o0 + p * kLanes + lane) of sums[k0 + t] += sum over the chunk's samples and
// pixels of grad[o] * input at the pixel's tap k0 + t. Output channels are the lanes: a packet of
// output gradients meets a broadcast input value, so no load splits a cache line and nothing is summed
// across lanes at the end, and the accumulators stay in registers over the whole chunk.
template <int Packets, int Taps>
void weight_gradient_block(const GradientChunk& chunk, int64_t o0, int64_t k0, float* sums) {
  const Conv2dGeometry& g = *chunk.geometry;
  const Layout& l = *chunk.layout;
  const GradientLayout& gl = *chunk.gradient;
  Packet acc[Packets][Taps];
  for (auto& packets : acc)
    for (Packet& a : packets) a = zero();
  std::array<int64_t, Taps> offsets;
  for (int t = 0; t < Taps; ++t) offsets[t] = l.offsets[k0 + t];
  for (int64_t s = 0; s < chunk.samples; ++s) {
    const float* input = chunk.inputs + s * l.input_floats;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const float* grad = chunk.grads + s * gl.sample_floats() + (gl.margin + oh * l.row) * gl.channels + o0;
      const float* in = input + oh * l.row;
      for (int64_t ow = 0; ow < g.out_w; ++ow, grad += gl.channels, ++in) {
        Packet gy[Packets];
        for (int p = 0; p < Packets; ++p) gy[p] = load(grad + p * kLanes);
        for (int t = 0; t < Taps; ++t) {
          const Packet x = pset1<Packet>(in[offsets[t]]);
          for (int p = 0; p < Packets; ++p) acc[p][t] = pmadd(gy[p], x, acc[p][t]);
        }
      }
    }
  }
  for (int t = 0; t < Taps; ++t)
    for (int p = 0; p < Packets; ++p) {
      float* lanes = sums + (k0 + t) * gl.channels + o0 + p * kLanes;
      pstoreu(lanes, padd(load(lanes), acc[p][t]));
    }
}

using WeightGradientKernel = void (*)(const GradientChunk&, int64_t, int64_t, float*);
template <int Packets>
constexpr auto weight_gradient_kernels() {
  return table_of<WeightGradientKernel>(std::make_index_sequence<kGradientTaps>(),
                                        []<int N>() { return &weight_gradient_block<Packets, N>; });
}
constexpr std::array kWeightGradientKernels = {weight_gradient_kernels<1>(), weight_gradient_kernels<2>(),
                                               weight_gradient_kernels<3>(), weight_gradient_kernels<4>()};
static_assert(kWeightGradientKernels.size() == kGradientPackets);

// Taps [k0, k0 + taps) of sums [patch, channels] for every output channel.
void weight_gradient_taps(const GradientChunk& chunk, int64_t k0, int64_t taps, float* sums) {
  const int64_t channels = chunk.gradient->channels;
  for (int64_t o0 = 0; o0 < channels; o0 += kGradientPackets * kLanes) {
    const int64_t packets = packets_from(o0, channels);
    kWeightGradientKernels[packets - 1][taps - 1](chunk, o0, k0, sums);
  }
}

// Lanes of bias_sums[o] += the chunk's output gradients summed over samples and rows (zeros included).
void bias_gradient(const GradientChunk& chunk, float* bias_sums) {
  const int64_t channels = chunk.gradient->channels, rows = chunk.samples * chunk.gradient->rows;
  for (int64_t o = 0; o < channels; o += kLanes) {
    Packet sum = load(bias_sums + o);
    for (int64_t r = 0; r < rows; ++r) sum = padd(sum, load(chunk.grads + r * channels + o));
    pstoreu(bias_sums + o, sum);
  }
}

// The padded input's gradient of one sample, channels last: out[j, c] = sum over taps t = (kh, kw)
// and output channels o of w[o, c, t] * grad[margin + j - (kh * Wp + kw), o], for `Pixels` rows j from
// j0 and input channels c0 + p * kLanes + lane. weights is [taps, out_channels, input channels
// rounded up to whole packets].
template <int Pixels, int Packets>
void input_gradient_block(const float* grad, const GradientLayout& gl, const Layout& l,
                          const Conv2dGeometry& g, const float* weights, int64_t in_channels, int64_t j0,
                          int64_t c0, float* out) {
  Packet acc[Pixels][Packets];
  for (auto& packets : acc)
    for (Packet& a : packets) a = zero();
  const int64_t O = g.out_channels;
  for (int64_t kh = 0; kh < g.kernel_h; ++kh)
    for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
      const float* rows = grad + (gl.margin + j0 - kh * l.row - kw) * gl.channels;
      const float* w = weights + (kh * g.kernel_w + kw) * O * in_channels + c0;
      for (int64_t o = 0; o < O; ++o, w += in_channels) {
        Packet wv[Packets];
        for (int p = 0; p < Packets; ++p) wv[p] = load(w + p * kLanes);
        for (int q = 0; q < Pixels; ++q) {
          const Packet gy = pset1<Packet>(rows[q * gl.channels + o]);
          for (int p = 0; p < Packets; ++p) acc[q][p] = pmadd(gy, wv[p], acc[q][p]);
        }
      }
    }
  for (int q = 0; q < Pixels; ++q)
    for (int p = 0; p < Packets; ++p) pstoreu(out + (j0 + q) * in_channels + c0 + p * kLanes, acc[q][p]);
}

template <int Packets>
constexpr auto input_gradient_kernel() {
  return &input_gradient_block<kInputPixels[Packets - 1], Packets>;
}
constexpr std::array kInputGradientKernels = {input_gradient_kernel<1>(), input_gradient_kernel<2>(),
                                              input_gradient_kernel<3>(), input_gradient_kernel<4>()};

// What the input gradient needs: the weights as [taps, out_channels, in_channels rounded up to whole
// packets], the lanes past in_channels zero.
struct InputGradient {
  InputGradient(const Conv2dGeometry& g, const float* w)
      : in_channels(round_up(g.channels, kLanes)),
        weights(
            zeroed_scratch<kInputGradientWeights>(g.kernel_h * g.kernel_w * g.out_channels * in_channels)) {
    const int64_t taps = g.kernel_h * g.kernel_w;
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t c = 0; c < g.channels; ++c)
        for (int64_t t = 0; t < taps; ++t)
          weights[(t * g.out_channels + o) * in_channels + c] = w[(o * g.channels + c) * taps + t];
  }
  int64_t in_channels;
  float* weights;
};

// gx += the input gradient of one sample from its output gradient rows; out is scratch of
// gl.input_rows * ig.in_channels floats.
void add_input_gradient(const Conv2dGeometry& g, const Layout& l, const GradientLayout& gl,
                        const InputGradient& ig, const float* grad, float* out, float* gx) {
  // Only the rows from the first input row's to the last's are read below, not the padding's rows
  // above and below (at 8x8, 20 of the padded plane's 100 pixels). Blocks start at multiples of their
  // size, so that the last ends inside gl.input_rows.
  const int64_t first_row = g.padding * l.row, end_row = (g.padding + g.height) * l.row;
  for (int64_t c0 = 0; c0 < ig.in_channels; c0 += kGradientPackets * kLanes) {
    const int64_t packets = packets_from(c0, ig.in_channels);
    const int64_t pixels = kInputPixels[packets - 1];
    for (int64_t j0 = first_row / pixels * pixels; j0 < end_row; j0 += pixels)
      kInputGradientKernels[packets - 1](grad, gl, l, g, ig.weights, ig.in_channels, j0, c0, out);
  }
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t h = 0; h < g.height; ++h) {
      const float* from = out + ((h + g.padding) * l.row + g.padding) * ig.in_channels + c;
      float* to = gx + (c * g.height + h) * g.width;
      for (int64_t col = 0; col < g.width; ++col) to[col] += from[col * ig.in_channels];
    }
}

}  // namespace

bool applies(const Conv2dGeometry& g) {
  // A 1x1 convolution's im2col is a plain copy and its GEMM's K the channel count, and rows whose
  // padding and kernel overhang make over a quarter of the grid waste (4x4 outputs in rows of 6) cost
  // more than im2col does: ResNet-50 at 64x64 trained at 0.73x of im2col's speed with every stride-1
  // convolution taken here, 1.05x with these two left to the GEMM. Short patches always pay.
  const bool one_by_one = g.kernel_h * g.kernel_w == 1;
  const bool narrow_rows = 4 * g.out_w < 3 * (g.width + 2 * g.padding);
  return g.stride == 1 && (g.patch() <= kShortPatch || (!one_by_one && !narrow_rows));
}

bool applies_backward(const Conv2dGeometry& g) {
  // ResNet-50's 3x3 layers of 256 and 512 channels (2.4 and 9.4 MB of weights) trained at 71 and 40
  // GFLOP/s here, 96 and 69 through im2col; those of 64 and 128 channels (0.15 and 0.6 MB) at 107 to
  // 128 GFLOP/s, 73 to 76 through im2col. Forward keeps them all: its weights stream once per sample
  // and it was faster at every size.
  // With AVX2 (a Zen 3 core, 2026-11-29) im2col won at every size but short patches, even with these
  // kernels blocked for 16 registers: ResNet-50's 64 and 128 channels took 318 and 283 ms of backward a
  // step against 388 and 432, the MNIST CNN's second layer 19.1 against 23.6 ms.
  constexpr int64_t kMaxWeightFloats = 256 * 1024;  // 1 MiB: half of L2 per core on the Intel kind
  return applies(g) &&
         (g.patch() <= kShortPatch || (kWideRegisterFile && g.out_channels * g.patch() <= kMaxWeightFloats));
}

void forward(const Conv2dGeometry& g, const float* x, const float* w, const PlaneVisitor& visit) {
  const Layout l = layout_of(g);
  const int64_t O = g.out_channels;
#pragma omp parallel
  {
    float* input = zeroed_scratch<kInput>(l.input_floats);
    float* grids = thread_scratch<kGrids>(O * l.grid + kLanes);
    float* plane = thread_scratch<kPlane>(g.pixels() + kLanes);
#pragma omp for schedule(static)
    for (int64_t sample = 0; sample < g.batch; ++sample) {
      pad_sample(g, l, x + sample * g.channels * g.height * g.width, input);
      forward_channels(input, l.offsets, w, O, l.grid, grids);
      for (int64_t o = 0; o < O; ++o) {
        grid_to_plane(g, l, grids + o * l.grid, plane);
        visit(sample, o, plane);
      }
    }
  }
}

void backward(const Conv2dGeometry& g, const float* x, const float* w, float* gx, float* gw, float* gbias,
              const GradientWriter& write_output_gradient) {
  const Layout l = layout_of(g);
  const GradientLayout gl(g, l);
  const int64_t O = g.out_channels, K = g.patch(), sample_floats = g.channels * g.height * g.width;
  const int64_t input_floats = gw ? l.input_floats : 0;
  // Chunks of samples whose output gradients and padded inputs fit in about half of L2.
  const int64_t chunk_samples =
      std::clamp<int64_t>(kChunkFloats / (gl.sample_floats() + input_floats), 1, g.batch);
  float* grads = thread_scratch<kGrads>(chunk_samples * gl.sample_floats());
  float* inputs = zeroed_scratch<kInputs>(chunk_samples * input_floats);
  float* weight_sums = zeroed_scratch<kWeightSums>(gw ? K * gl.channels : 0);
  float* bias_sums = zeroed_scratch<kBiasSums>(gbias ? gl.channels : 0);
  std::optional<InputGradient> input_gradient;
  if (gx) input_gradient.emplace(g, w);
  // The weight gradient in passes over groups of taps, one work item each, and one for the bias.
  const int64_t taps_per_pass = kTapsPerPass[packets_from(0, gl.channels) - 1];
  const int64_t groups = gw ? (K + taps_per_pass - 1) / taps_per_pass : 0;
#pragma omp parallel
  {
    float* out =
        gx ? thread_scratch<kInputGradientOut>(gl.input_rows * input_gradient->in_channels) : nullptr;
    for (int64_t first = 0; first < g.batch; first += chunk_samples) {
      const int64_t samples = std::min(chunk_samples, g.batch - first);
#pragma omp for schedule(static)
      for (int64_t s = 0; s < samples; ++s) {
        const int64_t sample = first + s;
        float* grad = grads + s * gl.sample_floats();
        std::fill_n(grad, gl.sample_floats(), 0.0f);
        write_output_gradient(sample, grad, gl.offset_of.data(), 1);
        if (gw) pad_sample(g, l, x + sample * sample_floats, inputs + s * input_floats);
        if (gx) add_input_gradient(g, l, gl, *input_gradient, grad, out, gx + sample * sample_floats);
      }
      if (!gw && !gbias) continue;
      const GradientChunk chunk{&g, &l, &gl, samples, grads, inputs};
#pragma omp for schedule(static)
      for (int64_t group = 0; group <= groups; ++group) {
        if (group == groups) {
          if (gbias) bias_gradient(chunk, bias_sums);
        } else {
          const int64_t k0 = group * taps_per_pass;
          weight_gradient_taps(chunk, k0, std::min(taps_per_pass, K - k0), weight_sums);
        }
      }
    }
  }
  for (int64_t o = 0; o < O; ++o) {
    if (gw)
      for (int64_t k = 0; k < K; ++k) gw[o * K + k] += weight_sums[k * gl.channels + o];
    if (gbias) gbias[o] += bias_sums[o];
  }
}

}  // namespace dptrain::cpu::direct_conv
