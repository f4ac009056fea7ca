// core/cpu/conv_winograd: F(2x2, 3x3) exact on small integers (every transform's product and sum is
// then a float without rounding, so the result must equal the convolution computed in integers),
// F(4x4, 3x3) within its roundings of them (its G holds 1/6 and 1/24), each gradient alone too, bit
// for bit the same at 1, 2 and 3 threads and for a sample alone or in a batch, and the cpu.winograd
// and cpu.winograd_tile switches.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/backend.h"
#include "core/cpu/conv_winograd.h"
#include "core/cpu/kernels.h"

namespace dptrain::cpu {
namespace {

// A 3x3 convolution at stride 1 with padding 1, the shape Winograd's kernels take.
Conv2dGeometry geometry(int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t out_channels,
                        bool relu = false) {
  return {batch, channels, h, w, out_channels, 3, 3, h, w, 1, 1, relu};
}

std::vector<float> values(int64_t n, uint32_t seed, bool integers) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = integers ? static_cast<float>(small(rng)) : uniform(rng);
  return v;
}

// F4's errors against exact sums, relative to their norm and to the largest value: within the
// conformance table's tolerance for products (its F4 rows: 1-2e-6 on uniform values; here up to
// 4.4e-6 of the largest value in the ASan build, whose clang rounds the transforms otherwise).
constexpr double kF4Error = 1e-5;

struct Problem {
  std::vector<float> x, w, bias, gy;
};
// The input, kernels, bias and output gradient of a convolution, from seeds seed to seed + 3.
Problem problem(const Conv2dGeometry& g, uint32_t seed, bool integers) {
  return {values(g.batch * g.channels * g.height * g.width, seed, integers),
          values(g.out_channels * g.channels * 9, seed + 1, integers),
          values(g.out_channels, seed + 2, integers),
          values(g.batch * g.out_channels * g.pixels(), seed + 3, integers)};
}

struct Gradients {
  std::vector<float> y, gx, gw, gbias;
};

// Forward, then backward from gy into fresh gradients (gx written, gw and gbias added into zeros).
Gradients run(const Conv2dGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
              const std::vector<float>& bias, const std::vector<float>& gy) {
  Gradients out{std::vector<float>(gy.size()), std::vector<float>(x.size()), std::vector<float>(w.size()),
                std::vector<float>(bias.size())};
  conv2d(x.data(), w.data(), bias.data(), out.y.data(), g);
  conv2d_backward(gy.data(), x.data(), w.data(), out.y.data(), GradientOut{out.gx.data(), true},
                  out.gw.data(), out.gbias.data(), g);
  return out;
}

// The convolution and its gradients in 64-bit integers (inputs that are integers; no ReLU).
Gradients exact(const Conv2dGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
                const std::vector<float>& bias, const std::vector<float>& gy) {
  const int64_t B = g.batch, C = g.channels, O = g.out_channels, H = g.height, W = g.width;
  std::vector<int64_t> y(gy.size()), gx(x.size()), gw(w.size()), gbias(bias.size());
  const auto at = [&](int64_t b, int64_t c, int64_t i, int64_t j) { return ((b * C + c) * H + i) * W + j; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < H; ++i)
        for (int64_t j = 0; j < W; ++j) {
          const std::size_t out = static_cast<std::size_t>(((b * O + o) * H + i) * W + j);
          const auto dy = static_cast<int64_t>(gy[out]);
          int64_t sum = static_cast<int64_t>(bias[static_cast<std::size_t>(o)]);
          gbias[static_cast<std::size_t>(o)] += dy;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < 3; ++kh)
              for (int64_t kw = 0; kw < 3; ++kw) {
                const int64_t ih = i + kh - 1, iw = j + kw - 1;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const auto in = static_cast<std::size_t>(at(b, c, ih, iw));
                const auto tap = static_cast<std::size_t>(((o * C + c) * 3 + kh) * 3 + kw);
                sum += static_cast<int64_t>(x[in]) * static_cast<int64_t>(w[tap]);
                gx[in] += dy * static_cast<int64_t>(w[tap]);
                gw[tap] += dy * static_cast<int64_t>(x[in]);
              }
          y[out] = sum;
        }
  const auto to_float = [](const std::vector<int64_t>& v) { return std::vector<float>(v.begin(), v.end()); };
  return {to_float(y), to_float(gx), to_float(gw), to_float(gbias)};
}

void expect_bitwise(const Gradients& a, const Gradients& b, const std::string& what) {
  EXPECT_EQ(a.y, b.y) << what << ": outputs";
  EXPECT_EQ(a.gx, b.gx) << what << ": input gradient";
  EXPECT_EQ(a.gw, b.gw) << what << ": weight gradient";
  EXPECT_EQ(a.gbias, b.gbias) << what << ": bias gradient";
}

// Shapes that take Winograd's kernels in both tiles: square and not, planes that tiles reach past,
// channel tails past whole packets, several groups of samples, and one whose samples go in bands of
// tile rows in F2's backward with both gradients (20 x 18 tiles, 360 a sample; one band forward or
// for one gradient); for F4 also its smallest planes and one in bands (13 x 12 tiles, 156 a sample:
// 10 rows and 3).
const std::vector<Conv2dGeometry> kShapes = {geometry(2, 16, 8, 8, 16), geometry(3, 24, 9, 12, 20),
                                             geometry(5, 40, 12, 12, 36), geometry(3, 16, 40, 36, 16),
                                             geometry(2, 16, 14, 14, 24)};
// Whether the default takes F4's weight gradient for each of kShapes: where F4's 4x4 tiles cover no
// more of the plane than F2's 2x2 tiles, by hand: 8x8, 12x12 and 40x36 exactly; over 9x12 F4's cover
// 12x12 against F2's 10x12, over 14x14 16x16 against 14x14.
const std::vector<bool> kF4WeightGradient = {true, false, true, true, false};
const std::vector<Conv2dGeometry> kF4Shapes = {geometry(3, 16, 5, 6, 20), geometry(2, 16, 4, 4, 24),
                                               geometry(2, 16, 52, 48, 16)};

// The tile of Winograd's kernels for a scope.
struct Tile {
  explicit Tile(int outputs) { set_cpu_options({.winograd_tile = outputs}); }
  ~Tile() { set_cpu_options({}); }
};

// ||got - want|| / ||want|| over every element, and the worst element's error against the largest
// |want|: F4's roundings, as the conformance table measures them.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  double diff = 0, norm = 0, worst = 0, largest = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
    worst = std::max(worst, std::abs(d));
    largest = std::max(largest, std::abs(static_cast<double>(want[i])));
  }
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LE(std::sqrt(diff / norm), kF4Error) << what;
  EXPECT_LE(worst / largest, kF4Error) << what;
}

TEST(Winograd, TakesTheseShapes) {
  EXPECT_EQ(cpu_options().winograd_tile, 2);
  for (const Conv2dGeometry& g : kShapes) EXPECT_TRUE(winograd_conv::applies(g));
  EXPECT_FALSE(winograd_conv::applies(geometry(2, 16, 7, 8, 16)));  // a plane under 8x8
  EXPECT_FALSE(winograd_conv::applies(kF4Shapes[0]));
  EXPECT_FALSE(winograd_conv::applies(geometry(2, 8, 16, 16, 16)));  // too few channels
  Conv2dGeometry padded_twice = geometry(2, 16, 16, 16, 16);
  padded_twice.padding = 2;
  padded_twice.out_h = padded_twice.out_w = 18;
  EXPECT_FALSE(winograd_conv::applies(padded_twice));
  const Tile f4(4);
  for (const Conv2dGeometry& g : kShapes) EXPECT_TRUE(winograd_conv::applies(g));
  for (const Conv2dGeometry& g : kF4Shapes) EXPECT_TRUE(winograd_conv::applies(g));
  EXPECT_FALSE(winograd_conv::applies(geometry(2, 16, 3, 8, 16)));  // a plane under 4x4
  EXPECT_FALSE(winograd_conv::applies(padded_twice));
}

// The default: F2's outputs and input gradient exact, and its weight gradient where F4 does not take
// it; F4's within its roundings.
TEST(Winograd, ExactOnSmallIntegersButF4sWeightGradient) {
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    const Conv2dGeometry& g = kShapes[i];
    SCOPED_TRACE(testing::Message() << "x [" << g.batch << ", " << g.channels << ", " << g.height << ", "
                                    << g.width << "], " << g.out_channels << " out");
    const auto [x, w, bias, gy] = problem(g, 1, true);
    const Gradients got = run(g, x, w, bias, gy), want = exact(g, x, w, bias, gy);
    EXPECT_EQ(got.y, want.y);
    EXPECT_EQ(got.gx, want.gx);
    EXPECT_EQ(got.gbias, want.gbias);
    if (kF4WeightGradient[i]) {
      expect_close(got.gw, want.gw, "weight gradient");
      EXPECT_NE(got.gw, want.gw) << "F4 rounds somewhere (else the weight gradient is not F4's)";
    } else {
      EXPECT_EQ(got.gw, want.gw) << "F2's weight gradient";
    }
  }
}

TEST(Winograd, F4WithinItsRoundingsOfSmallIntegers) {
  const Tile f4(4);
  std::vector<Conv2dGeometry> shapes = kShapes;
  shapes.insert(shapes.end(), kF4Shapes.begin(), kF4Shapes.end());
  for (const Conv2dGeometry& g : shapes) {
    SCOPED_TRACE(testing::Message() << "x [" << g.batch << ", " << g.channels << ", " << g.height << ", "
                                    << g.width << "], " << g.out_channels << " out");
    const auto [x, w, bias, gy] = problem(g, 1, true);
    const Gradients got = run(g, x, w, bias, gy), want = exact(g, x, w, bias, gy);
    expect_close(got.y, want.y, "outputs");
    expect_close(got.gx, want.gx, "input gradient");
    expect_close(got.gw, want.gw, "weight gradient");
    EXPECT_EQ(got.gbias, want.gbias);  // sums of integers, untransformed
    EXPECT_NE(got.y, want.y) << "F4 rounds somewhere (else the forward is not F4's)";
    EXPECT_NE(got.gx, want.gx) << "F4 rounds somewhere (else the input gradient is not F4's)";
  }
}

// Each gradient asked for alone (the pieces then differ), and an empty batch, which adds nothing
// (the weight gradient's sums are kept between calls). A sample's input gradient and the bias's sums
// do not depend on the pieces: they are those of the backward with every gradient, bit for bit.
TEST(Winograd, EachGradientAloneAndAnEmptyBatch) {
  struct Case {
    int tile;
    Conv2dGeometry g;
    bool exact_weight_gradient;  // F2's
  };
  for (const auto& [tile, g, exact_weight_gradient] :
       {Case{2, kShapes[3], false}, Case{2, kShapes[4], true}, Case{4, kF4Shapes[2], false}}) {
    SCOPED_TRACE(testing::Message() << "tile " << tile);
    const Tile chosen(tile);
    const auto [x, w, bias, gy] = problem(g, 13, true);
    const Gradients want = exact(g, x, w, bias, gy), together = run(g, x, w, bias, gy);
    std::vector<float> gx(x.size()), gw(w.size()), gbias(bias.size());
    conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{gx.data(), true}, nullptr,
                    nullptr, g);
    conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{}, gw.data(), nullptr, g);
    conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{}, nullptr, gbias.data(), g);
    EXPECT_EQ(gx, together.gx);
    if (tile == 2) {
      EXPECT_EQ(gx, want.gx);
    }
    expect_close(gw, want.gw, "weight gradient alone");
    if (exact_weight_gradient) {
      EXPECT_EQ(gw, want.gw) << "F2's weight gradient";
    }
    EXPECT_EQ(gbias, want.gbias);
    const std::vector<float> gw_before = gw;
    Conv2dGeometry empty = g;
    empty.batch = 0;
    conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{}, gw.data(), gbias.data(),
                    empty);
    EXPECT_EQ(gw, gw_before);
    EXPECT_EQ(gbias, want.gbias);
  }
}

TEST(Winograd, BitsDoNotDependOnThreadsOrTheBatch) {
  const int threads_before = omp_get_max_threads();
  for (const int tile : {4, 2}) {
    const Tile chosen(tile);
    std::vector<Conv2dGeometry> shapes = kShapes;
    if (tile == 4) shapes.insert(shapes.end(), kF4Shapes.begin(), kF4Shapes.end());
    for (Conv2dGeometry g : shapes) {
      g.fuse_relu = true;
      SCOPED_TRACE(testing::Message() << "tile " << tile << ", x [" << g.batch << ", " << g.channels << ", "
                                      << g.height << ", " << g.width << "]");
      const auto [x, w, bias, gy] = problem(g, 5, false);
      omp_set_num_threads(1);
      const Gradients one = run(g, x, w, bias, gy);
      for (int threads : {2, 3}) {
        omp_set_num_threads(threads);
        expect_bitwise(run(g, x, w, bias, gy), one, std::to_string(threads) + " threads");
      }
      // The last sample alone: its outputs and input gradient as in the batch.
      Conv2dGeometry alone = g;
      alone.batch = 1;
      const int64_t in = g.channels * g.height * g.width, out = g.out_channels * g.pixels();
      const int64_t last = g.batch - 1;
      const Gradients single =
          run(alone, {x.begin() + last * in, x.end()}, w, bias, {gy.begin() + last * out, gy.end()});
      EXPECT_EQ(single.y, std::vector<float>(one.y.begin() + last * out, one.y.end()));
      EXPECT_EQ(single.gx, std::vector<float>(one.gx.begin() + last * in, one.gx.end()));
    }
  }
  omp_set_num_threads(threads_before);
}

TEST(Winograd, TheSwitchesChooseTheForm) {
  const Conv2dGeometry g = kShapes[1];
  const auto [x, w, bias, gy] = problem(g, 9, false);
  set_cpu_options({.winograd = false});
  EXPECT_FALSE(winograd_conv::applies(g));
  const Gradients direct = run(g, x, w, bias, gy);
  set_cpu_options({.winograd_tile = 4});
  const Gradients f4 = run(g, x, w, bias, gy);
  set_cpu_options({});
  EXPECT_TRUE(winograd_conv::applies(g));
  EXPECT_EQ(cpu_options().winograd_tile, 2);
  // Other sums, so other roundings somewhere (the conformance table checks each against the reference).
  const Gradients f2 = run(g, x, w, bias, gy);
  EXPECT_NE(f2.y, direct.y);
  EXPECT_NE(f4.y, f2.y);
  EXPECT_NE(f4.gx, f2.gx);
  EXPECT_NE(f4.gw, f2.gw);
  EXPECT_NE(f2.gw, direct.gw);
  EXPECT_THROW(set_cpu_options({.winograd_tile = 3}), std::invalid_argument);
  EXPECT_EQ(cpu_options().winograd_tile, 2);  // unchanged by the refusal
}

}  // namespace
}  // namespace dptrain::cpu
