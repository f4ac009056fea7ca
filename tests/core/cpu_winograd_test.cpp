// core/cpu/conv_winograd: exact on small integers (every transform's product and sum is then a float
// without rounding, so the result must equal the convolution computed in integers), each gradient
// alone too, bit for bit the same at 1, 2 and 3 threads and for a sample alone or in a batch, and the
// cpu.winograd switch.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <random>
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

// Shapes that take Winograd's kernels: square and not, odd planes (a last tile half outside),
// channel tails past whole packets, several groups of samples, and one whose samples go in bands of
// tile rows in the backward with both gradients (20 x 18 tiles, 360 a sample; one band forward or
// for one gradient).
const std::vector<Conv2dGeometry> kShapes = {geometry(2, 16, 8, 8, 16), geometry(3, 24, 9, 12, 20),
                                             geometry(5, 40, 12, 12, 36), geometry(3, 16, 40, 36, 16)};

TEST(Winograd, TakesTheseShapes) {
  for (const Conv2dGeometry& g : kShapes) EXPECT_TRUE(winograd_conv::applies(g));
  EXPECT_FALSE(winograd_conv::applies(geometry(2, 16, 7, 8, 16)));   // a plane under 8x8
  EXPECT_FALSE(winograd_conv::applies(geometry(2, 8, 16, 16, 16)));  // too few channels
  Conv2dGeometry padded_twice = geometry(2, 16, 16, 16, 16);
  padded_twice.padding = 2;
  padded_twice.out_h = padded_twice.out_w = 18;
  EXPECT_FALSE(winograd_conv::applies(padded_twice));
}

TEST(Winograd, ExactOnSmallIntegers) {
  for (const Conv2dGeometry& g : kShapes) {
    SCOPED_TRACE(testing::Message() << "x [" << g.batch << ", " << g.channels << ", " << g.height << ", "
                                    << g.width << "], " << g.out_channels << " out");
    const std::vector<float> x = values(g.batch * g.channels * g.height * g.width, 1, true);
    const std::vector<float> w = values(g.out_channels * g.channels * 9, 2, true);
    const std::vector<float> bias = values(g.out_channels, 3, true);
    const std::vector<float> gy = values(g.batch * g.out_channels * g.pixels(), 4, true);
    expect_bitwise(run(g, x, w, bias, gy), exact(g, x, w, bias, gy), "against integers");
  }
}

// Each gradient asked for alone (the pieces then differ), and an empty batch, which adds nothing
// (the weight gradient's sums are kept between calls).
TEST(Winograd, EachGradientAloneAndAnEmptyBatch) {
  const Conv2dGeometry g = kShapes[3];
  const std::vector<float> x = values(g.batch * g.channels * g.height * g.width, 13, true);
  const std::vector<float> w = values(g.out_channels * g.channels * 9, 14, true);
  const std::vector<float> bias = values(g.out_channels, 15, true);
  const std::vector<float> gy = values(g.batch * g.out_channels * g.pixels(), 16, true);
  const Gradients want = exact(g, x, w, bias, gy);
  std::vector<float> gx(x.size()), gw(w.size()), gbias(bias.size());
  conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{gx.data(), true}, nullptr,
                  nullptr, g);
  conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{}, gw.data(), nullptr, g);
  conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{}, nullptr, gbias.data(), g);
  EXPECT_EQ(gx, want.gx);
  EXPECT_EQ(gw, want.gw);
  EXPECT_EQ(gbias, want.gbias);
  Conv2dGeometry empty = g;
  empty.batch = 0;
  conv2d_backward(gy.data(), x.data(), w.data(), want.y.data(), GradientOut{}, gw.data(), gbias.data(),
                  empty);
  EXPECT_EQ(gw, want.gw);
  EXPECT_EQ(gbias, want.gbias);
}

TEST(Winograd, BitsDoNotDependOnThreadsOrTheBatch) {
  const int threads_before = omp_get_max_threads();
  for (Conv2dGeometry g : kShapes) {
    g.fuse_relu = true;
    SCOPED_TRACE(testing::Message() << "x [" << g.batch << ", " << g.channels << ", " << g.height << ", "
                                    << g.width << "]");
    const std::vector<float> x = values(g.batch * g.channels * g.height * g.width, 5, false);
    const std::vector<float> w = values(g.out_channels * g.channels * 9, 6, false);
    const std::vector<float> bias = values(g.out_channels, 7, false);
    const std::vector<float> gy = values(g.batch * g.out_channels * g.pixels(), 8, false);
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
  omp_set_num_threads(threads_before);
}

TEST(Winograd, TheSwitchTurnsItOff) {
  const Conv2dGeometry g = kShapes[1];
  set_cpu_options({.winograd = false});
  EXPECT_FALSE(winograd_conv::applies(g));
  const std::vector<float> x = values(g.batch * g.channels * g.height * g.width, 9, false);
  const std::vector<float> w = values(g.out_channels * g.channels * 9, 10, false);
  const std::vector<float> bias = values(g.out_channels, 11, false);
  const std::vector<float> gy = values(g.batch * g.out_channels * g.pixels(), 12, false);
  const Gradients direct = run(g, x, w, bias, gy);
  set_cpu_options({});
  EXPECT_TRUE(winograd_conv::applies(g));
  // Other sums, so other roundings somewhere (the conformance table checks both against the reference).
  EXPECT_NE(run(g, x, w, bias, gy).y, direct.y);
}

}  // namespace
}  // namespace dptrain::cpu
