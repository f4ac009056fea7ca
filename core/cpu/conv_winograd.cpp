// 3x3 convolutions at stride 1 with padding 1 by Winograd's minimal filtering F(2x2, 3x3) (Lavin and
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). A 2x2 tile of outputs takes a 4x4
// tile of inputs d and the kernel g through
//   y = A^T [ (G g G^T) . (B^T d B) ] A                      (. elementwise)
// so each pair of channels makes 16 products for 4 outputs where the direct form makes 36. Over all
// channels the 16 elementwise products are 16 GEMMs, one per position xi of the 4x4 tile:
//   forward          M_xi[tile, o]  = V_xi[tile, c] U_xi[c, o]
//   input gradient   the same convolution of the output gradient, by the kernels turned by 180
//                    degrees with in and out swapped
//   weight gradient  dU_xi[o, c]   += Z_xi[tile, o]^T V_xi[tile, c],  Z = A dy A^T,  dg = G^T dU G
// Activations are copied channels-last into a zero-padded plane first (the output gradient is written
// there by its writer), so that every transform is a loop over channels in packets; the outputs go
// back to planes through register transposes.
//
// The transforms add and subtract, and G halves: the sums round differently from the direct form's
// (errors against a double reference of 2-3e-7 at 36-84 channels, as the direct form's 1-4e-7), and
// an infinite input gives NaN rather than +-Inf in the outputs it reaches (Inf - Inf in a transform).
// A sample's outputs and input gradient depend on that sample alone, and the weight and bias
// gradients sum over the batch in an order fixed by the geometry and the gradients asked for (which
// set the pieces): the bits do not depend on the thread count or the machine.
#include "core/cpu/conv_winograd.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/cpu/conv_small.h"
#include "core/cpu/gemm.h"
#include "core/cpu/packet.h"

namespace dptrain::cpu::winograd_conv {
namespace {

using Eigen::internal::padd;
using Eigen::internal::pmul;
using Eigen::internal::pnegate;
using Eigen::internal::psub;
using simd::Packet;
using simd::thread_scratch;

enum Slot {
  kKernelRows,
  kKernels,
  kPaddedInput,
  kPaddedGradient,
  kInputTiles,
  kGradientTiles,
  kProducts,
  kOutputs,
  kPlanes,
  kDiscarded,
  kKernelGradient,
  kKernelGradientByTap,
  kBiasGradient,
};

constexpr int64_t kPositions = 16;  // of a 4x4 tile
// Channels below this leave the GEMMs too short to pay for the transforms.
constexpr int64_t kMinChannels = 16;
// Over smaller planes the per-tap GEMMs of conv_small.h skip the padding's products and make few
// more than these kernels do (100 against 64 a channel pair over 4x4, 16 against 16 over 2x2), and
// these transform the kernels, 1.8x the weights, on every call: in resnet18's step (64x64 input,
// batch 32, one Intel Xeon core) its 256 channels over 4x4 took 3.48 ms a forward call this way
// against 3.12, and its 512 over 2x2 twice as long; ResNet-50's 512 over 7x7 (batch 16) 22.5 against
// 20.6 forward, 19.7 and 19.9 against 22.7 and 20.9 for the two gradients.
constexpr int64_t kMinPlane = 8;
// A piece of the batch: its transformed tiles and products in about 1 MiB, so that each pass over
// them finds what the one before wrote in L2, but at least 128 tiles, the rows of its GEMMs (at 256
// channels, 28 rows a GEMM took 23 ms a forward call over 14x14 at batch 16, 128 rows 15.4; over
// 56x56 at 64 channels, 19.5 ms at 128 rows against 20.5 at 64 and 20.8 at 256). Fixed figures, not
// the L2's size: the weight gradient sums piece by piece, and its bits must not change with the
// machine.
constexpr int64_t kPieceFloats = 256 * 1024;
constexpr int64_t kMinPieceTiles = 128;

// The plane in 2x2 output tiles, and the zero-padded input plane that their 4x4 input tiles cover
// (one pixel of padding before the plane; after it, one and what a last odd row or column needs).
struct Tiling {
  int64_t width, tiles_h, tiles_w, tiles, padded_w, padded;
  explicit Tiling(const Conv2dGeometry& g)
      : width(g.out_w),
        tiles_h((g.out_h + 1) / 2),
        tiles_w((g.out_w + 1) / 2),
        tiles(tiles_h * tiles_w),
        padded_w(2 * tiles_w + 2),
        padded((2 * tiles_h + 2) * padded_w) {}
  // Where pixel p of the plane lies in the padded plane.
  int64_t padded_pixel(int64_t p) const { return (p / width + 1) * padded_w + p % width + 1; }
  // The padded pixel at row r and column c of tile `tile`'s 4x4 inputs.
  int64_t tile_pixel(int64_t tile, int64_t r, int64_t c) const {
    return (2 * (tile / tiles_w) + r) * padded_w + 2 * (tile % tiles_w) + c;
  }
};

template <typename T>
T load(const float* p) {
  if constexpr (std::is_same_v<T, float>)
    return *p;
  else
    return simd::load(p);
}
template <typename T>
void store(float* p, T v) {
  if constexpr (std::is_same_v<T, float>)
    *p = v;
  else
    simd::pstoreu(p, v);
}

// f.operator()<T>(j) over [0, n): packets, then the tail float by float by the same arithmetic.
template <typename F>
void over_lanes(int64_t n, F f) {
  int64_t j = 0;
  for (; j + simd::kLanes <= n; j += simd::kLanes) f.template operator()<Packet>(j);
  for (; j < n; ++j) f.template operator()<float>(j);
}

// The transforms, each for the floats at j of its rows: 3x3, 4x4 or 2x2 matrices whose element (r, c)
// is row 3r + c, 4r + c or 2r + c.

// u = G g G^T, G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
template <typename T>
void transform_kernel(const float* const* g_rows, float* const* u, int64_t j) {
  const T half = simd::pset1<T>(0.5f);
  T g[9], s[4][3];
  for (int k = 0; k < 9; ++k) g[k] = load<T>(g_rows[k] + j);
  for (int c = 0; c < 3; ++c) {
    s[0][c] = g[c];
    s[1][c] = pmul(half, padd(padd(g[c], g[3 + c]), g[6 + c]));
    s[2][c] = pmul(half, padd(psub(g[c], g[3 + c]), g[6 + c]));
    s[3][c] = g[6 + c];
  }
  for (int r = 0; r < 4; ++r) {
    store(u[4 * r] + j, s[r][0]);
    store(u[4 * r + 1] + j, pmul(half, padd(padd(s[r][0], s[r][1]), s[r][2])));
    store(u[4 * r + 2] + j, pmul(half, padd(psub(s[r][0], s[r][1]), s[r][2])));
    store(u[4 * r + 3] + j, s[r][2]);
  }
}

// v = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
template <typename T>
void transform_input(const float* const* d_rows, float* const* v, int64_t j) {
  T d[16], s[4][4];
  for (int k = 0; k < 16; ++k) d[k] = load<T>(d_rows[k] + j);
  for (int c = 0; c < 4; ++c) {
    s[0][c] = psub(d[c], d[8 + c]);
    s[1][c] = padd(d[4 + c], d[8 + c]);
    s[2][c] = psub(d[8 + c], d[4 + c]);
    s[3][c] = psub(d[4 + c], d[12 + c]);
  }
  for (int r = 0; r < 4; ++r) {
    store(v[4 * r] + j, psub(s[r][0], s[r][2]));
    store(v[4 * r + 1] + j, padd(s[r][1], s[r][2]));
    store(v[4 * r + 2] + j, psub(s[r][2], s[r][1]));
    store(v[4 * r + 3] + j, psub(s[r][1], s[r][3]));
  }
}

// y = A^T m A, A^T = [1 1 1 0; 0 1 -1 -1].
template <typename T>
void transform_product(const float* const* m_rows, float* const* y, int64_t j) {
  T m[16], s[2][4];
  for (int k = 0; k < 16; ++k) m[k] = load<T>(m_rows[k] + j);
  for (int c = 0; c < 4; ++c) {
    s[0][c] = padd(padd(m[c], m[4 + c]), m[8 + c]);
    s[1][c] = psub(psub(m[4 + c], m[8 + c]), m[12 + c]);
  }
  for (int r = 0; r < 2; ++r) {
    store(y[2 * r] + j, padd(padd(s[r][0], s[r][1]), s[r][2]));
    store(y[2 * r + 1] + j, psub(psub(s[r][1], s[r][2]), s[r][3]));
  }
}

// z = A dy A^T: the gradient of m from that of y.
template <typename T>
void transform_output_gradient(const float* const* dy_rows, float* const* z, int64_t j) {
  T dy[4], s[4][2];
  for (int k = 0; k < 4; ++k) dy[k] = load<T>(dy_rows[k] + j);
  for (int c = 0; c < 2; ++c) {
    s[0][c] = dy[c];
    s[1][c] = padd(dy[c], dy[2 + c]);
    s[2][c] = psub(dy[c], dy[2 + c]);
    s[3][c] = pnegate(dy[2 + c]);
  }
  for (int r = 0; r < 4; ++r) {
    store(z[4 * r] + j, s[r][0]);
    store(z[4 * r + 1] + j, padd(s[r][0], s[r][1]));
    store(z[4 * r + 2] + j, psub(s[r][0], s[r][1]));
    store(z[4 * r + 3] + j, pnegate(s[r][1]));
  }
}

// dg = G^T du G: the gradient of g from that of u.
template <typename T>
void transform_kernel_gradient(const float* const* du_rows, float* const* dg, int64_t j) {
  const T half = simd::pset1<T>(0.5f);
  T du[16], s[3][4];
  for (int k = 0; k < 16; ++k) du[k] = load<T>(du_rows[k] + j);
  for (int c = 0; c < 4; ++c) {
    const T sum = pmul(half, padd(du[4 + c], du[8 + c]));
    s[0][c] = padd(du[c], sum);
    s[1][c] = pmul(half, psub(du[4 + c], du[8 + c]));
    s[2][c] = padd(sum, du[12 + c]);
  }
  for (int r = 0; r < 3; ++r) {
    const T sum = pmul(half, padd(s[r][1], s[r][2]));
    store(dg[3 * r] + j, padd(s[r][0], sum));
    store(dg[3 * r + 1] + j, pmul(half, psub(s[r][1], s[r][2])));
    store(dg[3 * r + 2] + j, padd(sum, s[r][3]));
  }
}

// U [16, in, out] from taps_of(i, k): where tap k of the kernels from input channel i lies, a row
// over the output channels.
template <typename TapsOf>
const float* transformed_kernels(int64_t in, int64_t out, TapsOf taps_of) {
  float* u = thread_scratch<kKernels>(kPositions * in * out);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < in; ++i) {
    const float* taps[9];
    float* to[kPositions];
    for (int k = 0; k < 9; ++k) taps[k] = taps_of(i, k);
    for (int64_t xi = 0; xi < kPositions; ++xi) to[xi] = u + (xi * in + i) * out;
    over_lanes(out, [&]<typename T>(int64_t j) { transform_kernel<T>(taps, to, j); });
  }
  return u;
}

// The batch in pieces of up to max(kPieceFloats / floats_per_tile, kMinPieceTiles) tiles: groups of
// whole samples, and where a sample's tiles alone outnumber that, each group (of one) in bands of
// tile rows.
struct Pieces {
  int64_t samples, tile_rows;
};
Pieces pieces_of(const Conv2dGeometry& g, const Tiling& t, int64_t floats_per_tile) {
  const int64_t tiles = std::max(kPieceFloats / std::max<int64_t>(1, floats_per_tile), kMinPieceTiles);
  if (t.tiles <= tiles) return {std::min(g.batch, tiles / t.tiles), t.tiles_h};
  return {1, std::max<int64_t>(1, tiles / t.tiles_w)};
}

// A band: tiles [tile0, tile0 + tiles) of samples [first, first + count), n = count * tiles of them,
// tile `tile0 + i` of sample `first + b` at index b * tiles + i.
struct Band {
  int64_t first, count, tile0, tiles;
  int64_t n() const { return count * tiles; }
};

// group_begin(first, count), band(Band) over its bands, group_end(first, count), group by group.
template <typename Begin, typename Each, typename End>
void over_pieces(const Conv2dGeometry& g, const Tiling& t, Pieces pieces, Begin group_begin, Each band,
                 End group_end) {
  for (int64_t first = 0; first < g.batch; first += pieces.samples) {
    const int64_t count = std::min(pieces.samples, g.batch - first);
    group_begin(first, count);
    for (int64_t row = 0; row < t.tiles_h; row += pieces.tile_rows)
      band(Band{first, count, row * t.tiles_w, std::min(pieces.tile_rows, t.tiles_h - row) * t.tiles_w});
    group_end(first, count);
  }
}

// f(b, tile, index) for every tile of the band, from several threads.
template <typename F>
void over_tiles(const Band& band, F f) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < band.count; ++b)
    for (int64_t i = 0; i < band.tiles; ++i) f(b, band.tile0 + i, b * band.tiles + i);
}

// product(xi) for the 16 positions, whole GEMMs spread over the threads, each on the thread that
// takes it. Split by columns instead (the GEMM's own threads), 64 output channels gave a thread at
// most two blocks, and the forks and joins of 16 small GEMMs a band cost more than the second thread
// gave: resnet18's 64 channels over 16x16 ran no faster on two threads than on one.
template <typename Product>
void over_positions(Product product) {
#pragma omp parallel for schedule(static)
  for (int64_t xi = 0; xi < kPositions; ++xi) product(xi);
}

// Samples [first, first + count) of x [batch, channels, P] channels-last into zero-padded planes.
float* padded_input(const Conv2dGeometry& g, const Tiling& t, const float* x, int64_t channels, int64_t first,
                    int64_t count) {
  const int64_t P = g.pixels();
  float* padded = thread_scratch<kPaddedInput>(count * t.padded * channels);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < count; ++b) {
    std::fill_n(padded + b * t.padded * channels, t.padded * channels, 0.0f);
    simd::transpose</*Add=*/false>(
        channels, P, simd::Rows{[&](int64_t c) { return x + ((first + b) * channels + c) * P; }},
        [&](int64_t p) { return padded + (b * t.padded + t.padded_pixel(p)) * channels; });
  }
  return padded;
}

// V [16, n, channels]: the band's 4x4 input tiles from `padded` ([count, padded, channels]),
// transformed, in the scratch buffer of slot S.
template <Slot S>
float* transformed_inputs(const Tiling& t, const Band& band, const float* padded, int64_t channels) {
  const int64_t n = band.n();
  float* v = thread_scratch<S>(kPositions * n * channels);
  over_tiles(band, [&](int64_t b, int64_t tile, int64_t index) {
    const float* d[kPositions];
    float* to[kPositions];
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      d[xi] = padded + (b * t.padded + t.tile_pixel(tile, xi / 4, xi % 4)) * channels;
      to[xi] = v + (xi * n + index) * channels;
    }
    over_lanes(channels, [&]<typename T>(int64_t j) { transform_input<T>(d, to, j); });
  });
  return v;
}

// Z [16, n, channels]: the band's 2x2 tiles of the output gradient, from `padded` as above (their
// pixels one row and column in from the input tiles' corners), transformed.
float* transformed_output_gradients(const Tiling& t, const Band& band, const float* padded,
                                    int64_t channels) {
  const int64_t n = band.n();
  float* z = thread_scratch<kGradientTiles>(kPositions * n * channels);
  over_tiles(band, [&](int64_t b, int64_t tile, int64_t index) {
    const float* dy[4];
    float* to[kPositions];
    for (int64_t k = 0; k < 4; ++k)
      dy[k] = padded + (b * t.padded + t.tile_pixel(tile, 1 + k / 2, 1 + k % 2)) * channels;
    for (int64_t xi = 0; xi < kPositions; ++xi) to[xi] = z + (xi * n + index) * channels;
    over_lanes(channels, [&]<typename T>(int64_t j) { transform_output_gradient<T>(dy, to, j); });
  });
  return z;
}

// The band's outputs [count, P, out] (in `outputs`, the group's) from V [16, n, in] and U [16, in, out].
void convolve_band(const Conv2dGeometry& g, const Tiling& t, const Band& band, const float* v, const float* u,
                   int64_t in, int64_t out, float* outputs) {
  const int64_t n = band.n(), P = g.pixels();
  float* m = thread_scratch<kProducts>(kPositions * n * out);
  over_positions([&](int64_t xi) {
    gemm(n, out, in, {v + xi * n * in, in}, {u + xi * in * out, out}, m + xi * n * out, out,
         /*accumulate=*/false);
  });
  over_tiles(band, [&](int64_t b, int64_t tile, int64_t index) {
    const float* from[kPositions];
    float* to[4];
    for (int64_t xi = 0; xi < kPositions; ++xi) from[xi] = m + (xi * n + index) * out;
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t oh = 2 * (tile / t.tiles_w) + k / 2, ow = 2 * (tile % t.tiles_w) + k % 2;
      // A last row or column past an odd plane's goes to a row that nobody reads.
      to[k] = oh < g.out_h && ow < g.out_w ? outputs + (b * P + oh * g.out_w + ow) * out
                                           : thread_scratch<kDiscarded>(out);
    }
    over_lanes(out, [&]<typename T>(int64_t j) { transform_product<T>(from, to, j); });
  });
}

// Sample b's outputs [P, channels] as planes [channels, P], in a buffer of the calling thread's.
float* planes_of(const float* outputs, int64_t b, int64_t P, int64_t channels) {
  float* planes = thread_scratch<kPlanes>(channels * P);
  simd::transpose</*Add=*/false>(P, channels,
                                 simd::Rows{[&](int64_t p) { return outputs + (b * P + p) * channels; }},
                                 [&](int64_t c) { return planes + c * P; });
  return planes;
}

// gw [O, C, 3, 3] += G^T du G, du [16, O, C].
void add_kernel_gradient(const float* du, int64_t O, int64_t C, float* gw) {
  float* by_tap = thread_scratch<kKernelGradientByTap>(9 * O * C);  // [9, O, C]
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < O; ++o) {
    const float* from[kPositions];
    float* to[9];
    for (int64_t xi = 0; xi < kPositions; ++xi) from[xi] = du + (xi * O + o) * C;
    for (int k = 0; k < 9; ++k) to[k] = by_tap + (k * O + o) * C;
    over_lanes(C, [&]<typename T>(int64_t j) { transform_kernel_gradient<T>(from, to, j); });
    for (int64_t c = 0; c < C; ++c)
      for (int k = 0; k < 9; ++k) gw[(o * C + c) * 9 + k] += by_tap[(k * O + o) * C + c];
  }
}

}  // namespace

bool applies(const Conv2dGeometry& g) {
  return cpu_options().winograd && g.kernel_h == 3 && g.kernel_w == 3 && g.stride == 1 && g.padding == 1 &&
         g.channels >= kMinChannels && g.out_channels >= kMinChannels &&
         std::min(g.height, g.width) >= kMinPlane;
}

void forward(const Conv2dGeometry& g, const float* x, const float* w,
             const direct_conv::PlaneVisitor& visit) {
  const Tiling t(g);
  const int64_t C = g.channels, O = g.out_channels, P = g.pixels(), K = C * 9;
  // W [O, C * 9] transposed, so that a tap from input channel c is a row over the output channels.
  float* by_row = thread_scratch<kKernelRows>(K * O);
  simd::transpose</*Add=*/false>(O, K, simd::Rows{[&](int64_t o) { return w + o * K; }},
                                 [&](int64_t k) { return by_row + k * O; });
  const float* u = transformed_kernels(C, O, [&](int64_t c, int k) { return by_row + (c * 9 + k) * O; });
  const float* padded = nullptr;
  float* outputs = nullptr;
  over_pieces(
      g, t, pieces_of(g, t, kPositions * (C + O)),
      [&](int64_t first, int64_t count) {
        padded = padded_input(g, t, x, C, first, count);
        outputs = thread_scratch<kOutputs>(count * P * O);
      },
      [&](const Band& band) {
        convolve_band(g, t, band, transformed_inputs<kInputTiles>(t, band, padded, C), u, C, O, outputs);
      },
      [&](int64_t first, int64_t count) {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < count; ++b) {
          float* planes = planes_of(outputs, b, P, O);
          for (int64_t o = 0; o < O; ++o) visit(first + b, o, planes + o * P);
        }
      });
}

void backward(const Conv2dGeometry& g, const float* x, const float* w, GradientOut gx, float* gw,
              float* gbias, const direct_conv::GradientWriter& write_output_gradient) {
  const Tiling t(g);
  const int64_t C = g.channels, O = g.out_channels, P = g.pixels();
  const float* u = nullptr;
  if (gx) {
    // W's taps apart ([9, O, C]), so that a tap from output channel o is a row over the input
    // channels; the turned kernel's tap k is the kernel's tap 8 - k.
    const float* by_tap = small_plane_conv::weights_by_tap(g, w);
    u = transformed_kernels(O, C, [&](int64_t o, int k) { return by_tap + (8 - k) * O * C + o * C; });
  }
  float* du = gw ? thread_scratch<kKernelGradient>(kPositions * O * C) : nullptr;
  float* bias_sums = gbias ? thread_scratch<kBiasGradient>(O) : nullptr;
  if (gbias) std::fill_n(bias_sums, O, 0.0f);
  std::vector<int64_t> offset_of(static_cast<std::size_t>(P));
  for (int64_t p = 0; p < P; ++p) offset_of[static_cast<std::size_t>(p)] = t.padded_pixel(p) * O;

  // The gradients' tiles and products; with neither (the bias's alone) the padded output gradient's
  // share, so that a piece does not take the whole batch.
  const int64_t backward_floats_per_tile =
      kPositions * std::max<int64_t>((gx ? O + C : 0) + (gw ? O + C : 0), O);
  const float *gradient = nullptr, *input = nullptr;
  float* outputs = nullptr;
  bool summed = false;  // whether du holds a band's sums yet
  over_pieces(
      g, t, pieces_of(g, t, backward_floats_per_tile),
      [&](int64_t first, int64_t count) {
        float* padded = thread_scratch<kPaddedGradient>(count * t.padded * O);
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < count; ++b) {
          std::fill_n(padded + b * t.padded * O, t.padded * O, 0.0f);
          write_output_gradient(first + b, padded + b * t.padded * O, offset_of.data(), 1);
        }
        gradient = padded;
        if (gbias)  // sample by sample, pixel by pixel: an order that no piece size changes
          for (int64_t b = 0; b < count; ++b)
            for (int64_t p = 0; p < P; ++p) {
              const float* row = padded + b * t.padded * O + offset_of[static_cast<std::size_t>(p)];
              over_lanes(O, [&]<typename T>(int64_t j) {
                store(bias_sums + j, padd(load<T>(bias_sums + j), load<T>(row + j)));
              });
            }
        if (gw) input = padded_input(g, t, x, C, first, count);
        if (gx) outputs = thread_scratch<kOutputs>(count * P * C);
      },
      [&](const Band& band) {
        if (gx)
          convolve_band(g, t, band, transformed_inputs<kGradientTiles>(t, band, gradient, O), u, O, C,
                        outputs);
        if (!gw) return;
        const int64_t n = band.n();
        const float* z = transformed_output_gradients(t, band, gradient, O);
        const float* v = transformed_inputs<kInputTiles>(t, band, input, C);
        over_positions([&](int64_t xi) {
          gemm(O, C, n, {z + xi * n * O, O, /*transposed=*/true}, {v + xi * n * C, C}, du + xi * O * C, C,
               /*accumulate=*/summed);
        });
        summed = true;
      },
      [&](int64_t first, int64_t count) {
        if (!gx) return;
      // Through planes in cache and then in one pass over the sample's [C, P]: transposed straight
      // into gx, rows a plane apart, ResNet-50's 128 channels over 28x28 spent a quarter of the
      // input gradient's time writing them.
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < count; ++b) {
          const float* planes = planes_of(outputs, b, P, C);
          float* to = gx.data + (first + b) * C * P;
          if (gx.overwrite)
            std::copy_n(planes, C * P, to);
          else
            over_lanes(C * P, [&]<typename T>(int64_t j) {
              store(to + j, padd(load<T>(to + j), load<T>(planes + j)));
            });
        }
      });
  if (gbias)
    for (int64_t o = 0; o < O; ++o) gbias[o] += bias_sums[o];
  if (gw && summed) add_kernel_gradient(du, O, C, gw);  // not for an empty batch: du is as it was left
}

}  // namespace dptrain::cpu::winograd_conv
