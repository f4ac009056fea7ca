// 3x3 convolutions at stride 1 with padding 1 by Winograd's minimal filtering F(2x2, 3x3) and
// F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). An mxm
// tile of outputs takes an (m+2)x(m+2) tile of inputs d and the kernel g through
//   y = A^T [ (G g G^T) . (B^T d B) ] A                      (. elementwise)
// so each pair of channels makes (m+2)^2 products for m^2 outputs where the direct form makes 9 an
// output: 16 for 4 in F2, 36 for 16 in F4. Over all channels the elementwise products are GEMMs, one
// per position xi of the input tile:
//   forward          M_xi[tile, o]  = V_xi[tile, c] U_xi[c, o]
//   input gradient   the same convolution of the output gradient, by the kernels turned by 180
//                    degrees with in and out swapped
//   weight gradient  dU_xi[o, c]   += Z_xi[tile, o]^T V_xi[tile, c],  Z = A dy A^T,  dg = G^T dU G
// The forward and the input gradient take F2 (F4 where cpu_options().winograd_tile is 4), the weight
// gradient F4 where its tiles fit the plane as closely as F2's (see backward). Activations are
// copied channels-last into a zero-padded plane first (the output gradient is written there by its
// writer), so that every transform is a loop over channels in packets; the outputs go back to planes
// through register transposes.
//
// The transforms add, subtract and scale, so the sums round differently from the direct form's:
// errors against a double reference of 2-3e-7 at 36-84 channels in F2 (the direct form's 1-4e-7),
// 1-2e-6 in F4, whose matrices hold 5, 8 and 1/24 (most of it the rounding of the products' sums,
// which A then scales). An infinite input gives NaN rather than +-Inf in the outputs it reaches
// (Inf - Inf in a transform). A sample's outputs and input gradient depend on that sample alone, and
// the weight and bias gradients sum over the batch in an order fixed by the geometry and the
// gradients asked for (which set the pieces): the bits do not depend on the thread count or the
// machine.
#include "core/cpu/conv_winograd.h"

#include <algorithm>
#include <array>
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
  kPackedKernels,
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

// Channels below this leave the GEMMs too short to pay for the transforms.
constexpr int64_t kMinChannels = 16;
// A piece of the batch: its transformed tiles and products in about 1 MiB, so that each pass over
// them finds what the one before wrote in L2, but at least 128 tiles, the rows of its GEMMs (at 256
// channels, 28 rows a GEMM took 23 ms a forward call over 14x14 at batch 16, 128 rows 15.4; over
// 56x56 at 64 channels, 19.5 ms at 128 rows against 20.5 at 64 and 20.8 at 256). Fixed figures, not
// the L2's size: the weight gradient sums piece by piece, and its bits must not change with the
// machine.
constexpr int64_t kPieceFloats = 256 * 1024;
constexpr int64_t kMinPieceTiles = 128;

// The plane in tiles of F::kOut x F::kOut outputs, and the zero-padded input plane that their input
// tiles (F::kIn = kOut + 2 a side) cover: one pixel of padding before the plane; after it, one and what
// a last row or column of tiles reaching past the plane needs.
template <typename F>
struct Tiling {
  static constexpr int64_t kPositions = F::kIn * F::kIn;  // of an input tile
  int64_t width, tiles_h, tiles_w, tiles, padded_w, padded;
  explicit Tiling(const Conv2dGeometry& g)
      : width(g.out_w),
        tiles_h((g.out_h + F::kOut - 1) / F::kOut),
        tiles_w((g.out_w + F::kOut - 1) / F::kOut),
        tiles(tiles_h * tiles_w),
        padded_w(F::kOut * tiles_w + 2),
        padded((F::kOut * tiles_h + 2) * padded_w) {}
  // Where pixel p of the plane lies in the padded plane.
  int64_t padded_pixel(int64_t p) const { return (p / width + 1) * padded_w + p % width + 1; }
  // The padded pixel at row r and column c of tile `tile`'s input tile.
  int64_t tile_pixel(int64_t tile, int64_t r, int64_t c) const {
    return (F::kOut * (tile / tiles_w) + r) * padded_w + F::kOut * (tile % tiles_w) + c;
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

// The tile sizes as five one-dimensional transforms, each from n values x[0], x[xs], ... to m values
// y[0], y[ys], ...; a two-dimensional transform L x L^T applies one to the columns and then to the
// rows (separable below).

// F(2x2, 3x3) at the points 0, 1, -1 and infinity.
struct F2 {
  static constexpr int64_t kOut = 2, kIn = 4;
  // Over smaller planes the per-tap GEMMs of conv_small.h skip the padding's products and make few
  // more than these kernels do (100 against 64 a channel pair over 4x4, 16 against 16 over 2x2), and
  // these transform the kernels, 1.8x the weights, on every call: in resnet18's step (64x64 input,
  // batch 32, one Intel Xeon core) its 256 channels over 4x4 took 3.48 ms a forward call this way
  // against 3.12, and its 512 over 2x2 twice as long; ResNet-50's 512 over 7x7 (batch 16) 22.5
  // against 20.6 forward, 19.7 and 19.9 against 22.7 and 20.9 for the two gradients.
  static constexpr int64_t kMinPlane = 8;
  // G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
  template <typename T>
  static void kernel(const T* g, int64_t gs, T* u, int64_t us) {
    const T half = simd::pset1<T>(0.5f);
    u[0] = g[0];
    u[us] = pmul(half, padd(padd(g[0], g[gs]), g[2 * gs]));
    u[2 * us] = pmul(half, padd(psub(g[0], g[gs]), g[2 * gs]));
    u[3 * us] = g[2 * gs];
  }
  // B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
  template <typename T>
  static void input(const T* d, int64_t ds, T* v, int64_t vs) {
    v[0] = psub(d[0], d[2 * ds]);
    v[vs] = padd(d[ds], d[2 * ds]);
    v[2 * vs] = psub(d[2 * ds], d[ds]);
    v[3 * vs] = psub(d[ds], d[3 * ds]);
  }
  // A^T = [1 1 1 0; 0 1 -1 -1]
  template <typename T>
  static void product(const T* m, int64_t ms, T* y, int64_t ys) {
    y[0] = padd(padd(m[0], m[ms]), m[2 * ms]);
    y[ys] = psub(psub(m[ms], m[2 * ms]), m[3 * ms]);
  }
  // A, for the gradient of m from that of y
  template <typename T>
  static void output_gradient(const T* dy, int64_t dys, T* z, int64_t zs) {
    z[0] = dy[0];
    z[zs] = padd(dy[0], dy[dys]);
    z[2 * zs] = psub(dy[0], dy[dys]);
    z[3 * zs] = pnegate(dy[dys]);
  }
  // G^T, for the gradient of g from that of u
  template <typename T>
  static void kernel_gradient(const T* du, int64_t dus, T* dg, int64_t dgs) {
    const T half = simd::pset1<T>(0.5f);
    const T sum = pmul(half, padd(du[dus], du[2 * dus]));
    dg[0] = padd(du[0], sum);
    dg[dgs] = pmul(half, psub(du[dus], du[2 * dus]));
    dg[2 * dgs] = padd(sum, du[3 * dus]);
  }
};

// F(4x4, 3x3) at the points 0, 1, -1, 2, -2 and infinity: 36 products for 16 outputs (2.25 a
// channel pair and output, against F2's 4), with coefficients up to 8 in A and 5 in B, so that its
// sums round further from the direct form's than F2's do.
struct F4 {
  static constexpr int64_t kOut = 4, kIn = 6;
  // Where F4 takes the forward (winograd_tile 4): over 4x4 one tile makes 36 products a channel
  // pair where the per-tap GEMMs of conv_small.h make 100; over 2x2, 36 against 16; over 7x7, 144
  // against 361, but the kernels transformed are 4x the weights. ms a call forward, input and weight
  // gradient on one Intel Xeon core, per-tap -> F4: resnet18's 256 channels over 4x4 at batch 32,
  // 3.03, 3.01, 3.01 -> 2.83, 2.63, 2.63 (built for AVX2: 4.84, 4.81, 4.97 -> 4.11, 3.70, 3.74);
  // ResNet-50's 512 over 7x7 at batch 16, 21.0, 22.6, 21.5 -> 22.4, 19.0, 18.5 (AVX2: 34.8, 37.3,
  // 34.5 -> 35.5, 31.1, 24.7).
  static constexpr int64_t kMinPlane = 4;
  // G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
  template <typename T>
  static void kernel(const T* g, int64_t gs, T* u, int64_t us) {
    const T outer = padd(g[0], g[2 * gs]);
    const T minus_sixth = simd::pset1<T>(-1.0f / 6),
            even = padd(pmul(simd::pset1<T>(1.0f / 24), g[0]), pmul(simd::pset1<T>(1.0f / 6), g[2 * gs]));
    const T odd = pmul(simd::pset1<T>(1.0f / 12), g[gs]);
    u[0] = pmul(simd::pset1<T>(0.25f), g[0]);
    u[us] = pmul(minus_sixth, padd(outer, g[gs]));
    u[2 * us] = pmul(minus_sixth, psub(outer, g[gs]));
    u[3 * us] = padd(even, odd);
    u[4 * us] = psub(even, odd);
    u[5 * us] = g[2 * gs];
  }
  // B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
  template <typename T>
  static void input(const T* d, int64_t ds, T* v, int64_t vs) {
    const T four = simd::pset1<T>(4.0f), five = simd::pset1<T>(5.0f), two = simd::pset1<T>(2.0f);
    const T d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds];
    const T by4 = psub(d4, pmul(four, d2)), odd_by4 = psub(d3, pmul(four, d1));
    const T by2 = psub(d4, d2), odd_by2 = pmul(two, psub(d3, d1));
    v[0] = padd(psub(pmul(four, d[0]), pmul(five, d2)), d4);
    v[vs] = padd(by4, odd_by4);
    v[2 * vs] = psub(by4, odd_by4);
    v[3 * vs] = padd(by2, odd_by2);
    v[4 * vs] = psub(by2, odd_by2);
    v[5 * vs] = padd(psub(pmul(four, d1), pmul(five, d3)), d[5 * ds]);
  }
  // A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
  template <typename T>
  static void product(const T* m, int64_t ms, T* y, int64_t ys) {
    const T sum1 = padd(m[ms], m[2 * ms]), difference1 = psub(m[ms], m[2 * ms]);
    const T sum2 = padd(m[3 * ms], m[4 * ms]), difference2 = psub(m[3 * ms], m[4 * ms]);
    y[0] = padd(padd(m[0], sum1), sum2);
    y[ys] = padd(difference1, pmul(simd::pset1<T>(2.0f), difference2));
    y[2 * ys] = padd(sum1, pmul(simd::pset1<T>(4.0f), sum2));
    y[3 * ys] = padd(padd(difference1, pmul(simd::pset1<T>(8.0f), difference2)), m[5 * ms]);
  }
  // A, for the gradient of m from that of y
  template <typename T>
  static void output_gradient(const T* dy, int64_t dys, T* z, int64_t zs) {
    const T four = simd::pset1<T>(4.0f);
    const T even1 = padd(dy[0], dy[2 * dys]), odd1 = padd(dy[dys], dy[3 * dys]);
    const T even2 = padd(dy[0], pmul(four, dy[2 * dys]));
    const T odd2 = pmul(simd::pset1<T>(2.0f), padd(dy[dys], pmul(four, dy[3 * dys])));
    z[0] = dy[0];
    z[zs] = padd(even1, odd1);
    z[2 * zs] = psub(even1, odd1);
    z[3 * zs] = padd(even2, odd2);
    z[4 * zs] = psub(even2, odd2);
    z[5 * zs] = dy[3 * dys];
  }
  // G^T, for the gradient of g from that of u
  template <typename T>
  static void kernel_gradient(const T* du, int64_t dus, T* dg, int64_t dgs) {
    const T sum1 = padd(du[dus], du[2 * dus]), difference1 = psub(du[dus], du[2 * dus]);
    const T sum2 = padd(du[3 * dus], du[4 * dus]), difference2 = psub(du[3 * dus], du[4 * dus]);
    const T sixth = simd::pset1<T>(1.0f / 6);
    dg[0] = padd(psub(pmul(simd::pset1<T>(0.25f), du[0]), pmul(sixth, sum1)),
                 pmul(simd::pset1<T>(1.0f / 24), sum2));
    dg[dgs] = psub(pmul(simd::pset1<T>(1.0f / 12), difference2), pmul(sixth, difference1));
    dg[2 * dgs] = padd(pmul(sixth, psub(sum2, sum1)), du[5 * dus]);
  }
};

// to = L from L^T for the one-dimensional transform L (n values to m), each matrix row-major and
// element k at from[k] + j and to[k] + j: the columns first, then the rows.
template <int64_t n, int64_t m, typename T, typename OneD>
void transform(const float* const* from, float* const* to, int64_t j, OneD one_d) {
  T x[n * n], columns[m * n], y[m * m];
  for (int64_t k = 0; k < n * n; ++k) x[k] = load<T>(from[k] + j);
  for (int64_t c = 0; c < n; ++c) one_d(x + c, n, columns + c, n);
  for (int64_t r = 0; r < m; ++r) one_d(columns + r * n, int64_t{1}, y + r * m, int64_t{1});
  for (int64_t k = 0; k < m * m; ++k) store(to[k] + j, y[k]);
}

// product(xi) for the positions, whole GEMMs spread over the threads, each on the thread that
// takes it. Split by columns instead (the GEMM's own threads), 64 output channels gave a thread at
// most two blocks, and the forks and joins of 16 small GEMMs a band cost more than the second thread
// gave: resnet18's 64 channels over 16x16 ran no faster on two threads than on one.
template <typename F, typename Product>
void over_positions(Product product) {
#pragma omp parallel for schedule(static)
  for (int64_t xi = 0; xi < Tiling<F>::kPositions; ++xi) product(xi);
}

// U_xi [in, out] for each position xi, packed for the GEMMs (pack_right), from taps_of(i, k): where
// tap k of the kernels from input channel i lies, a row over the output channels. Packed once here
// rather than copied by every band's GEMMs: over ResNet-50's 14x14 at 256 channels, U's 4 MiB went
// from memory into the GEMMs' copies 8 times a call.
template <typename F>
using PackedKernels = std::array<PackedRight, Tiling<F>::kPositions>;
template <typename F, typename TapsOf>
PackedKernels<F> transformed_kernels(int64_t in, int64_t out, TapsOf taps_of) {
  constexpr int64_t kPositions = Tiling<F>::kPositions;
  float* u = thread_scratch<kKernels>(kPositions * in * out);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < in; ++i) {
    const float* taps[9];
    float* to[kPositions];
    for (int k = 0; k < 9; ++k) taps[k] = taps_of(i, k);
    for (int64_t xi = 0; xi < kPositions; ++xi) to[xi] = u + (xi * in + i) * out;
    over_lanes(out, [&]<typename T>(int64_t j) {
      transform<3, F::kIn, T>(taps, to, j,
                              [](const T* a, int64_t as, T* b, int64_t bs) { F::kernel(a, as, b, bs); });
    });
  }
  const int64_t packed_floats = packed_right_floats(in, out);
  float* packed = thread_scratch<kPackedKernels>(kPositions * packed_floats);
  PackedKernels<F> by_position;
  over_positions<F>([&](int64_t xi) {
    by_position[static_cast<std::size_t>(xi)] =
        pack_right(in, out, {u + xi * in * out, out}, packed + xi * packed_floats);
  });
  return by_position;
}

// The batch in pieces of up to max(kPieceFloats / floats_per_tile, kMinPieceTiles) tiles: groups of
// whole samples, and where a sample's tiles alone outnumber that, each group (of one) in bands of
// tile rows.
struct Pieces {
  int64_t samples, tile_rows;
};
template <typename F>
Pieces pieces_of(const Conv2dGeometry& g, const Tiling<F>& t, int64_t floats_per_tile) {
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
template <typename F, typename Begin, typename Each, typename End>
void over_pieces(const Conv2dGeometry& g, const Tiling<F>& t, Pieces pieces, Begin group_begin, Each band,
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

// Samples [first, first + count) of x [batch, channels, P] channels-last into zero-padded planes.
template <typename F>
float* padded_input(const Conv2dGeometry& g, const Tiling<F>& t, const float* x, int64_t channels,
                    int64_t first, int64_t count) {
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

// V [positions, n, channels]: the band's input tiles from `padded` ([count, padded, channels]),
// transformed, in the scratch buffer of slot S.
template <Slot S, typename F>
float* transformed_inputs(const Tiling<F>& t, const Band& band, const float* padded, int64_t channels) {
  constexpr int64_t kPositions = Tiling<F>::kPositions;
  const int64_t n = band.n();
  float* v = thread_scratch<S>(kPositions * n * channels);
  over_tiles(band, [&](int64_t b, int64_t tile, int64_t index) {
    const float* d[kPositions];
    float* to[kPositions];
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      d[xi] = padded + (b * t.padded + t.tile_pixel(tile, xi / F::kIn, xi % F::kIn)) * channels;
      to[xi] = v + (xi * n + index) * channels;
    }
    over_lanes(channels, [&]<typename T>(int64_t j) {
      transform<F::kIn, F::kIn, T>(d, to, j,
                                   [](const T* a, int64_t as, T* b, int64_t bs) { F::input(a, as, b, bs); });
    });
  });
  return v;
}

// Z [positions, n, channels]: the band's output tiles of the output gradient, from `padded` as above
// (their pixels one row and column in from the input tiles' corners), transformed.
template <typename F>
float* transformed_output_gradients(const Tiling<F>& t, const Band& band, const float* padded,
                                    int64_t channels) {
  constexpr int64_t kPositions = Tiling<F>::kPositions, kOutputs = F::kOut * F::kOut;
  const int64_t n = band.n();
  float* z = thread_scratch<kGradientTiles>(kPositions * n * channels);
  over_tiles(band, [&](int64_t b, int64_t tile, int64_t index) {
    const float* dy[kOutputs];
    float* to[kPositions];
    for (int64_t k = 0; k < kOutputs; ++k)
      dy[k] = padded + (b * t.padded + t.tile_pixel(tile, 1 + k / F::kOut, 1 + k % F::kOut)) * channels;
    for (int64_t xi = 0; xi < kPositions; ++xi) to[xi] = z + (xi * n + index) * channels;
    over_lanes(channels, [&]<typename T>(int64_t j) {
      transform<F::kOut, F::kIn, T>(
          dy, to, j, [](const T* a, int64_t as, T* b, int64_t bs) { F::output_gradient(a, as, b, bs); });
    });
  });
  return z;
}

// The band's outputs [count, P, out] (in `outputs`, the group's) from V [positions, n, in] and U.
template <typename F>
void convolve_band(const Conv2dGeometry& g, const Tiling<F>& t, const Band& band, const float* v,
                   const PackedKernels<F>& u, int64_t in, int64_t out, float* outputs) {
  constexpr int64_t kPositions = Tiling<F>::kPositions, kOutputs = F::kOut * F::kOut;
  const int64_t n = band.n(), P = g.pixels();
  float* m = thread_scratch<kProducts>(kPositions * n * out);
  over_positions<F>([&](int64_t xi) {
    gemm_packed_right(n, out, in, {v + xi * n * in, in}, u[static_cast<std::size_t>(xi)], m + xi * n * out,
                      out,
                      /*accumulate=*/false);
  });
  over_tiles(band, [&](int64_t b, int64_t tile, int64_t index) {
    const float* from[kPositions];
    float* to[kOutputs];
    for (int64_t xi = 0; xi < kPositions; ++xi) from[xi] = m + (xi * n + index) * out;
    for (int64_t k = 0; k < kOutputs; ++k) {
      const int64_t oh = F::kOut * (tile / t.tiles_w) + k / F::kOut,
                    ow = F::kOut * (tile % t.tiles_w) + k % F::kOut;
      // A row or column of a last tile past the plane goes to a row that nobody reads.
      to[k] = oh < g.out_h && ow < g.out_w ? outputs + (b * P + oh * g.out_w + ow) * out
                                           : thread_scratch<kDiscarded>(out);
    }
    over_lanes(out, [&]<typename T>(int64_t j) {
      transform<F::kIn, F::kOut, T>(
          from, to, j, [](const T* a, int64_t as, T* b, int64_t bs) { F::product(a, as, b, bs); });
    });
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

// gw [O, C, 3, 3] += G^T du G, du [positions, O, C].
template <typename F>
void add_kernel_gradient(const float* du, int64_t O, int64_t C, float* gw) {
  constexpr int64_t kPositions = Tiling<F>::kPositions;
  float* by_tap = thread_scratch<kKernelGradientByTap>(9 * O * C);  // [9, O, C]
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < O; ++o) {
    const float* from[kPositions];
    float* to[9];
    for (int64_t xi = 0; xi < kPositions; ++xi) from[xi] = du + (xi * O + o) * C;
    for (int k = 0; k < 9; ++k) to[k] = by_tap + (k * O + o) * C;
    over_lanes(C, [&]<typename T>(int64_t j) {
      transform<F::kIn, 3, T>(
          from, to, j, [](const T* a, int64_t as, T* b, int64_t bs) { F::kernel_gradient(a, as, b, bs); });
    });
    for (int64_t c = 0; c < C; ++c)
      for (int k = 0; k < 9; ++k) gw[(o * C + c) * 9 + k] += by_tap[(k * O + o) * C + c];
  }
}

}  // namespace

namespace {

template <typename F>
void forward_by(const Conv2dGeometry& g, const float* x, const float* w,
                const direct_conv::PlaneVisitor& visit) {
  const Tiling<F> t(g);
  constexpr int64_t kPositions = Tiling<F>::kPositions;
  const int64_t C = g.channels, O = g.out_channels, P = g.pixels(), K = C * 9;
  // W [O, C * 9] transposed, so that a tap from input channel c is a row over the output channels.
  float* by_row = thread_scratch<kKernelRows>(K * O);
  simd::transpose</*Add=*/false>(O, K, simd::Rows{[&](int64_t o) { return w + o * K; }},
                                 [&](int64_t k) { return by_row + k * O; });
  const PackedKernels<F> u =
      transformed_kernels<F>(C, O, [&](int64_t c, int k) { return by_row + (c * 9 + k) * O; });
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

template <typename F>
void backward_by(const Conv2dGeometry& g, const float* x, const float* w, GradientOut gx, float* gw,
                 float* gbias, const direct_conv::GradientWriter& write_output_gradient) {
  const Tiling<F> t(g);
  constexpr int64_t kPositions = Tiling<F>::kPositions;
  const int64_t C = g.channels, O = g.out_channels, P = g.pixels();
  PackedKernels<F> u;
  if (gx) {
    // W's taps apart ([9, O, C]), so that a tap from output channel o is a row over the input
    // channels; the turned kernel's tap k is the kernel's tap 8 - k.
    const float* by_tap = small_plane_conv::weights_by_tap(g, w);
    u = transformed_kernels<F>(O, C, [&](int64_t o, int k) { return by_tap + (8 - k) * O * C + o * C; });
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
        over_positions<F>([&](int64_t xi) {
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
  if (gw && summed) add_kernel_gradient<F>(du, O, C, gw);  // not for an empty batch: du is as it was left
}

}  // namespace

bool applies(const Conv2dGeometry& g) {
  return cpu_options().winograd && g.kernel_h == 3 && g.kernel_w == 3 && g.stride == 1 && g.padding == 1 &&
         g.channels >= kMinChannels && g.out_channels >= kMinChannels &&
         std::min(g.height, g.width) >= (cpu_options().winograd_tile == 2 ? F2::kMinPlane : F4::kMinPlane);
}

void forward(const Conv2dGeometry& g, const float* x, const float* w,
             const direct_conv::PlaneVisitor& visit) {
  if (cpu_options().winograd_tile == 2) return forward_by<F2>(g, x, w, visit);
  forward_by<F4>(g, x, w, visit);
}

void backward(const Conv2dGeometry& g, const float* x, const float* w, GradientOut gx, float* gw,
              float* gbias, const direct_conv::GradientWriter& write_output_gradient) {
  if (cpu_options().winograd_tile == 4) return backward_by<F4>(g, x, w, gx, gw, gbias, write_output_gradient);
  // F2's input gradient, and F4's weight gradient where F4's tiles cover no more of the plane than
  // F2's: the roundings of an input gradient (as of the outputs) pass on through every layer below
  // and compound over the steps, those of a weight gradient stay in its update. With F4's everywhere
  // resnet20's three SGD steps came 2.9e-5 (of the largest element) from PyTorch's, with F2's 4.0e-6,
  // this way 5.5e-6; and resnet18's and ResNet-50's steps built for AVX2 take 3.0% and 1.8% less
  // time than with F2's. Where F4's tiles reach further past the plane, outputs that nobody reads eat
  // up its saving, and the output gradient takes a second pass: ResNet-50's 256 channels
  // over 14x14 (F4's tiles cover 16x16) took 31.9 ms for both gradients that way against 30.3 by F2
  // alone (one Intel Xeon core, medians of 6 interleaved runs).
  const int64_t f2_covers = Tiling<F2>(g).tiles * F2::kOut * F2::kOut,
                f4_covers = Tiling<F4>(g).tiles * F4::kOut * F4::kOut;
  if (f4_covers > f2_covers) return backward_by<F2>(g, x, w, gx, gw, gbias, write_output_gradient);
  if (gx) {
    backward_by<F2>(g, x, w, gx, nullptr, nullptr, write_output_gradient);
    gx = GradientOut{};
  }
  if (gw || gbias) backward_by<F4>(g, x, w, gx, gw, gbias, write_output_gradient);
}

}  // namespace dptrain::cpu::winograd_conv
