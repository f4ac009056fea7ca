// Central-difference gradient checks for every op in core/ops.h, plus forward checks against naive
// double-precision references, closed-form losses (including extreme logits) and dropout's mask.
//
// Objective: L(y) = sum_i y_i * w_i with fixed random w. Backward builds it from ops (reshape to
// [1, n], linear with a [1, n] weight, sum); finite differences evaluate it in double from the
// forward output computed without recording. Each input element x is moved to the float values
// x+eps and x-eps and the difference quotient divides by their actual (double) distance.
//
// Tolerance: |analytic - fd| <= 1e-3 + 1e-2 * max(|analytic|, |fd|), eps = 1e-2. With inputs of
// order 1, rounding noise in L is ~1e-6 (only the outputs an input touches change, each by float
// rounding ~1e-7), i.e. ~1e-4 after dividing by 2*eps; the truncation error of tanh/sigmoid is
// eps^2/6 * |f'''| < 1e-4; linear ops have none. A wrong index, missing term or factor gives an
// error of order 0.1..1, far above the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace dptrain {
namespace {

constexpr double kEps = 1e-2;
constexpr double kRtol = 1e-2;
constexpr double kAtol = 1e-3;

using test_util::uniform_values;

Tensor random_tensor(const Shape& shape, uint64_t seed, bool requires_grad = true, float lo = -1.0f,
                     float hi = 1.0f) {
  return Tensor::from_data(shape, uniform_values(shape_numel(shape), seed, lo, hi), requires_grad);
}

// Values with |v| in [0.1, 1] and random sign: at least 10 eps away from relu's kink.
Tensor away_from_zero(const Shape& shape, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = rng.uniform(0.1f, 1.0f) * (rng.uniform() < 0.5f ? -1.0f : 1.0f);
  return Tensor::from_data(shape, v, true);
}

// Distinct values 0.05 apart in random order: finite differences (+-eps = 0.01) never change a
// max-pool winner, and there are no ties.
Tensor distinct_values(const Shape& shape, uint64_t seed) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 0.05f * static_cast<float>(i) - 0.025f * static_cast<float>(n);
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(static_cast<uint64_t>(i + 1))]);
  return Tensor::from_data(shape, v, true);
}

using Op = std::function<Tensor(const std::vector<Tensor>&)>;

// L(y) = sum(y * w): as a differentiable graph and, for finite differences, in double.
struct Projection {
  explicit Projection(int64_t n, uint64_t seed) : w(uniform_values(n, seed, -1.0f, 1.0f)) {
    weight = Tensor::from_data({1, n}, w);
  }
  Tensor graph(const Tensor& y) const {
    return ops::sum(ops::linear(ops::reshape(y, {1, y.numel()}), weight, Tensor()));
  }
  double value(const Tensor& y) const {
    double total = 0.0;
    for (int64_t i = 0; i < y.numel(); ++i) total += static_cast<double>(y.data()[i]) * w[i];
    return total;
  }
  std::vector<float> w;
  Tensor weight;
};

// Checks d sum(f(inputs) * w) / d input for every input that requires grad, element by element.
void gradcheck(const Op& f, const std::vector<Tensor>& inputs, double eps = kEps, double rtol = kRtol,
               double atol = kAtol) {
  autograd::clear_tape();
  for (const Tensor& t : inputs)
    if (t.requires_grad()) t.zero_grad();
  const Tensor y = f(inputs);
  ASSERT_TRUE(y.requires_grad()) << "the output of an op with differentiable inputs must require grad";
  const Projection projection(y.numel(), 99);
  const Tensor loss = projection.graph(y);
  EXPECT_NEAR(loss.item(), projection.value(y), 1e-5 * (1.0 + std::abs(projection.value(y))));
  loss.backward();
  EXPECT_EQ(autograd::tape_size(), 0u);

  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    ASSERT_TRUE(x.has_grad()) << "input " << k << " requires grad but got none";
    const std::vector<float> analytic(x.grad().begin(), x.grad().end());
    int failures = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      float* p = x.data() + i;
      const float saved = *p;
      const float plus = static_cast<float>(saved + eps), minus = static_cast<float>(saved - eps);
      double l_plus, l_minus;
      {
        NoGradGuard guard;
        *p = plus;
        l_plus = projection.value(f(inputs));
        *p = minus;
        l_minus = projection.value(f(inputs));
      }
      *p = saved;
      const double fd = (l_plus - l_minus) / (static_cast<double>(plus) - static_cast<double>(minus));
      const double an = analytic[i];
      const double tol = atol + rtol * std::max(std::abs(an), std::abs(fd));
      if (std::abs(an - fd) > tol && ++failures <= 5)
        ADD_FAILURE() << "input " << k << " element " << i << ": analytic " << an << " vs finite difference "
                      << fd;
    }
    EXPECT_EQ(failures, 0) << "input " << k << ": " << failures << " of " << x.numel() << " elements differ";
  }
  EXPECT_EQ(autograd::tape_size(), 0u) << "finite-difference passes must not record";
}

void expect_forward(const Tensor& y, const std::vector<double>& ref, double rtol = 1e-5, double atol = 1e-5) {
  ASSERT_EQ(static_cast<std::size_t>(y.numel()), ref.size());
  int failures = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (std::abs(y.data()[i] - ref[i]) > atol + rtol * std::abs(ref[i]) && ++failures <= 5)
      ADD_FAILURE() << "output " << i << ": " << y.data()[i] << " vs reference " << ref[i];
  EXPECT_EQ(failures, 0);
}

// ---- naive references ----------------------------------------------------------------------

std::vector<double> ref_matmul(const Tensor& a, const Tensor& b) {
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  std::vector<double> y(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < k; ++t)
        y[i * n + j] += static_cast<double>(a.data()[i * k + t]) * b.data()[t * n + j];
  return y;
}

std::vector<double> ref_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t batch = x.dim(0), in = x.dim(1), out = w.dim(0);
  std::vector<double> y(batch * out, 0.0);
  for (int64_t i = 0; i < batch; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.defined() ? b.data()[o] : 0.0;
      for (int64_t t = 0; t < in; ++t)
        acc += static_cast<double>(x.data()[i * in + t]) * w.data()[o * in + t];
      y[i * out + o] = acc;
    }
  return y;
}

std::vector<double> ref_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int stride, int pad) {
  const int64_t B = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t O = w.dim(0), KH = w.dim(2), KW = w.dim(3);
  const int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
  std::vector<double> y(B * O * OH * OW, 0.0);
  for (int64_t n = 0; n < B; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double acc = b.defined() ? b.data()[o] : 0.0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = i * stride - pad + kh, iw = j * stride - pad + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += static_cast<double>(x.data()[((n * C + c) * H + ih) * W + iw]) *
                       w.data()[((o * C + c) * KH + kh) * KW + kw];
              }
          y[((n * O + o) * OH + i) * OW + j] = acc;
        }
  return y;
}

std::vector<double> ref_maxpool(const Tensor& x, int k, int s) {
  const int64_t P = x.dim(0) * x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  std::vector<double> y;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < OH; ++i)
      for (int64_t j = 0; j < OW; ++j) {
        double best = -INFINITY;
        for (int a = 0; a < k; ++a)
          for (int c = 0; c < k; ++c)
            best = std::max<double>(best, x.data()[(p * H + i * s + a) * W + j * s + c]);
        y.push_back(best);
      }
  return y;
}

// ---- matmul, linear, add_bias ---------------------------------------------------------------

TEST(GradCheck, Matmul) {
  const Tensor a = random_tensor({3, 4}, 1), b = random_tensor({4, 5}, 2);
  expect_forward(ops::matmul(a, b), ref_matmul(a, b));
  gradcheck([](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); }, {a, b});
}

TEST(GradCheck, MatmulVectorShapes) {
  const Tensor a = random_tensor({1, 6}, 3), b = random_tensor({6, 1}, 4);
  expect_forward(ops::matmul(a, b), ref_matmul(a, b));
  gradcheck([](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); }, {a, b});
}

TEST(GradCheck, LinearWithBias) {
  const Tensor x = random_tensor({3, 5}, 5), w = random_tensor({4, 5}, 6), b = random_tensor({4}, 7);
  expect_forward(ops::linear(x, w, b), ref_linear(x, w, b));
  gradcheck([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); }, {x, w, b});
}

TEST(GradCheck, LinearWithoutBias) {
  const Tensor x = random_tensor({2, 7}, 8), w = random_tensor({3, 7}, 9);
  expect_forward(ops::linear(x, w, Tensor()), ref_linear(x, w, Tensor()));
  gradcheck([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], Tensor()); }, {x, w});
}

TEST(GradCheck, AddBias4d) {
  const Tensor x = random_tensor({2, 3, 4, 5}, 10), b = random_tensor({3}, 11);
  const Tensor y = ops::add_bias(x, b);
  std::vector<double> ref(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) ref[i] = static_cast<double>(x.data()[i]) + b.data()[(i / 20) % 3];
  expect_forward(y, ref);
  gradcheck([](const std::vector<Tensor>& in) { return ops::add_bias(in[0], in[1]); }, {x, b});
}

TEST(GradCheck, AddBias2d) {
  const Tensor x = random_tensor({4, 3}, 12), b = random_tensor({3}, 13);
  gradcheck([](const std::vector<Tensor>& in) { return ops::add_bias(in[0], in[1]); }, {x, b});
}

// ---- conv2d ---------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  Shape x, w;
  int stride, pad;
  bool bias;
};

void PrintTo(const ConvCase& c, std::ostream* os) {
  *os << c.name;
}

class ConvGradCheck : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvGradCheck, ForwardAndGradients) {
  const ConvCase& c = GetParam();
  const Tensor x = random_tensor(c.x, 20), w = random_tensor(c.w, 21),
               b = c.bias ? random_tensor({c.w[0]}, 22) : Tensor();
  const Tensor y = ops::conv2d(x, w, b, {c.stride, c.pad});
  const int64_t oh = (c.x[2] + 2 * c.pad - c.w[2]) / c.stride + 1,
                ow = (c.x[3] + 2 * c.pad - c.w[3]) / c.stride + 1;
  EXPECT_EQ(y.shape(), (Shape{c.x[0], c.w[0], oh, ow}));
  expect_forward(y, ref_conv2d(x, w, b, c.stride, c.pad));
  const int stride = c.stride, pad = c.pad;
  std::vector<Tensor> inputs{x, w};
  if (c.bias) inputs.push_back(b);
  gradcheck(
      [stride, pad](const std::vector<Tensor>& in) {
        return ops::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), {stride, pad});
      },
      inputs);
}

INSTANTIATE_TEST_SUITE_P(
    Conv, ConvGradCheck,
    ::testing::Values(ConvCase{"s1p0", {2, 3, 6, 6}, {4, 3, 3, 3}, 1, 0, true},
                      ConvCase{"s2p1", {2, 3, 7, 7}, {2, 3, 3, 3}, 2, 1, true},
                      ConvCase{"k5s1p2", {1, 2, 6, 6}, {3, 2, 5, 5}, 1, 2, true},
                      ConvCase{"nonsquare_s2p1", {2, 2, 6, 9}, {3, 2, 3, 3}, 2, 1, true},
                      ConvCase{"nonsquare_s1p0_nobias", {1, 3, 4, 7}, {2, 3, 3, 3}, 1, 0, false},
                      ConvCase{"nonsquare_kernel", {1, 2, 5, 6}, {2, 2, 3, 2}, 1, 1, true}),
    [](const ::testing::TestParamInfo<ConvCase>& info) { return std::string(info.param.name); });

// ---- maxpool2d ------------------------------------------------------------------------------

struct PoolCase {
  const char* name;
  Shape x;
  int kernel, stride;
};

void PrintTo(const PoolCase& c, std::ostream* os) {
  *os << c.name;
}

class PoolGradCheck : public ::testing::TestWithParam<PoolCase> {};

TEST_P(PoolGradCheck, ForwardAndGradients) {
  const PoolCase& c = GetParam();
  const Tensor x = distinct_values(c.x, 30);
  const Tensor y = ops::maxpool2d(x, c.kernel, c.stride);
  EXPECT_EQ(y.shape(),
            (Shape{c.x[0], c.x[1], (c.x[2] - c.kernel) / c.stride + 1, (c.x[3] - c.kernel) / c.stride + 1}));
  expect_forward(y, ref_maxpool(x, c.kernel, c.stride), 0.0, 0.0);  // a max is exact
  const int k = c.kernel, s = c.stride;
  gradcheck([k, s](const std::vector<Tensor>& in) { return ops::maxpool2d(in[0], k, s); }, {x});
}

INSTANTIATE_TEST_SUITE_P(Pool, PoolGradCheck,
                         ::testing::Values(PoolCase{"k2s2", {2, 3, 6, 6}, 2, 2},
                                           PoolCase{"k3s2", {2, 2, 7, 7}, 3, 2},
                                           PoolCase{"k2s2_ragged", {1, 2, 7, 5}, 2, 2},
                                           PoolCase{"k3s1_overlap", {1, 1, 5, 6}, 3, 1}),
                         [](const ::testing::TestParamInfo<PoolCase>& info) {
                           return std::string(info.param.name);
                         });

// Padded windows: positions outside the plane take no part (PyTorch pads with -inf).
TEST(GradCheck, MaxPoolWithPadding) {
  const Tensor x = distinct_values({2, 2, 7, 6}, 31);
  const Tensor y = ops::maxpool2d(x, 3, 2, 1);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 4, 3}));
  std::vector<double> ref;
  for (int64_t p = 0; p < 4; ++p)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        double best = -INFINITY;
        for (int64_t r = 2 * i - 1; r < 2 * i + 2; ++r)
          for (int64_t c = 2 * j - 1; c < 2 * j + 2; ++c)
            if (r >= 0 && r < 7 && c >= 0 && c < 6)
              best = std::max<double>(best, x.data()[(p * 7 + r) * 6 + c]);
        ref.push_back(best);
      }
  expect_forward(y, ref, 0.0, 0.0);
  gradcheck([](const std::vector<Tensor>& in) { return ops::maxpool2d(in[0], 3, 2, 1); }, {x});
  EXPECT_THROW(ops::maxpool2d(x, 3, 2, 2), Error);  // padding beyond half the kernel
}

// ---- global average pooling, residual add ----------------------------------------------------

TEST(GradCheck, GlobalAvgPool) {
  const Tensor x = random_tensor({2, 3, 4, 5}, 32);
  const Tensor y = ops::global_avgpool(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3}));
  std::vector<double> ref;
  for (int64_t p = 0; p < 6; ++p) {
    double total = 0;
    for (int64_t i = 0; i < 20; ++i) total += x.data()[p * 20 + i];
    ref.push_back(total / 20);
  }
  expect_forward(y, ref);
  gradcheck([](const std::vector<Tensor>& in) { return ops::global_avgpool(in[0]); }, {x});
}

TEST(GradCheck, Add) {
  const Tensor a = random_tensor({2, 3, 4}, 33), b = random_tensor({2, 3, 4}, 34);
  std::vector<double> ref;
  for (int64_t i = 0; i < a.numel(); ++i) ref.push_back(static_cast<double>(a.data()[i]) + b.data()[i]);
  expect_forward(ops::add(a, b), ref);
  gradcheck([](const std::vector<Tensor>& in) { return ops::add(in[0], in[1]); }, {a, b});
  // The same tensor on both sides gets both contributions.
  gradcheck([](const std::vector<Tensor>& in) { return ops::add(in[0], in[0]); }, {a});
}

// ---- batch normalisation ----------------------------------------------------------------------

// Training mode: the batch's mean and biased variance per channel, by the definition in double.
std::vector<double> ref_batch_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t B = x.dim(0), C = x.dim(1), inner = x.numel() / (B * C);
  std::vector<double> y(x.numel());
  for (int64_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < B; ++n)
      for (int64_t i = 0; i < inner; ++i) mean += x.data()[(n * C + c) * inner + i];
    mean /= B * inner;
    for (int64_t n = 0; n < B; ++n)
      for (int64_t i = 0; i < inner; ++i) var += std::pow(x.data()[(n * C + c) * inner + i] - mean, 2);
    var /= B * inner;
    for (int64_t n = 0; n < B; ++n)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t at = (n * C + c) * inner + i;
        y[at] = (x.data()[at] - mean) / std::sqrt(var + eps) * w.data()[c] + b.data()[c];
      }
  }
  return y;
}

TEST(GradCheck, BatchNormTraining) {
  const Tensor x = random_tensor({4, 3, 3, 2}, 35, true, -2.0f, 3.0f);
  const Tensor w = random_tensor({3}, 36, true, 0.5f, 1.5f), b = random_tensor({3}, 37);
  const ops::BatchNormOptions train{.training = true};
  expect_forward(ops::batch_norm(x, w, b, Tensor(), Tensor(), train), ref_batch_norm(x, w, b, 1e-5), 1e-5,
                 1e-5);
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return ops::batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), train);
      },
      {x, w, b});
  // [B, C] inputs (BatchNorm1d's layout) normalise over the batch alone.
  const Tensor flat = random_tensor({5, 3}, 38);
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return ops::batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), train);
      },
      {flat, w, b});
}

TEST(BatchNorm, RunningStatisticsFollowPyTorchsUpdate) {
  const Tensor x = random_tensor({4, 2, 3, 3}, 39, false, -1.0f, 2.0f);
  const Tensor w = Tensor::full({2}, 1.0f), b = Tensor::zeros({2});
  const Tensor mean = Tensor::from_data({2}, std::vector<float>{0.5f, -0.5f});
  const Tensor var = Tensor::from_data({2}, std::vector<float>{2.0f, 0.5f});
  ops::batch_norm(x, w, b, mean, var, {.training = true, .momentum = 0.25f});
  for (int64_t c = 0; c < 2; ++c) {
    double m = 0, v = 0;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 9; ++i) m += x.data()[(n * 2 + c) * 9 + i];
    m /= 36;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 9; ++i) v += std::pow(x.data()[(n * 2 + c) * 9 + i] - m, 2);
    const double unbiased = v / 35;  // running_var takes the unbiased estimate, normalisation the biased
    EXPECT_NEAR(mean.data()[c], 0.75 * (c == 0 ? 0.5 : -0.5) + 0.25 * m, 1e-6);
    EXPECT_NEAR(var.data()[c], 0.75 * (c == 0 ? 2.0 : 0.5) + 0.25 * unbiased, 1e-6);
  }
}

TEST(GradCheck, BatchNormEvaluation) {
  const Tensor x = random_tensor({3, 2, 2, 3}, 40);
  const Tensor w = random_tensor({2}, 41, true, 0.5f, 1.5f), b = random_tensor({2}, 42);
  const Tensor mean = random_tensor({2}, 43, false), var = random_tensor({2}, 44, false, 0.5f, 2.0f);
  const ops::BatchNormOptions eval{.training = false};
  std::vector<double> ref;
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t i = 0; i < 6; ++i)
        ref.push_back((x.data()[(n * 2 + c) * 6 + i] - mean.data()[c]) / std::sqrt(var.data()[c] + 1e-5) *
                          w.data()[c] +
                      b.data()[c]);
  const std::vector<float> mean_before = mean.to_vector();
  expect_forward(ops::batch_norm(x, w, b, mean, var, eval), ref);
  EXPECT_EQ(mean.to_vector(), mean_before) << "evaluation must not move the running statistics";
  gradcheck(
      [&](const std::vector<Tensor>& in) { return ops::batch_norm(in[0], in[1], in[2], mean, var, eval); },
      {x, w, b});
}

TEST(BatchNorm, RejectsBadShapesAndSingleValues) {
  const Tensor w = Tensor::full({3}, 1.0f), b = Tensor::zeros({3});
  EXPECT_THROW(ops::batch_norm(random_tensor({2, 4, 3, 3}, 45), w, b, Tensor(), Tensor(), {}), Error);
  // One value per channel has no variance: PyTorch refuses it too.
  EXPECT_THROW(ops::batch_norm(random_tensor({1, 3}, 46), w, b, Tensor(), Tensor(), {}), Error);
  EXPECT_THROW(ops::batch_norm(random_tensor({2, 3}, 47), w, b, Tensor(), Tensor(), {.training = false}),
               Error);
}

// ---- pointwise ------------------------------------------------------------------------------

TEST(GradCheck, Relu) {
  const Tensor x = away_from_zero({3, 8}, 40);
  std::vector<double> ref;
  for (float v : x.values()) ref.push_back(v > 0 ? v : 0.0);
  expect_forward(ops::relu(x), ref, 0.0, 0.0);
  gradcheck([](const std::vector<Tensor>& in) { return ops::relu(in[0]); }, {x});
}

TEST(GradCheck, Tanh) {
  const Tensor x = random_tensor({3, 8}, 41, true, -2.0f, 2.0f);
  std::vector<double> ref;
  for (float v : x.values()) ref.push_back(std::tanh(static_cast<double>(v)));
  expect_forward(ops::tanh(x), ref, 1e-6, 1e-7);
  gradcheck([](const std::vector<Tensor>& in) { return ops::tanh(in[0]); }, {x});
}

TEST(GradCheck, Sigmoid) {
  const Tensor x = random_tensor({3, 8}, 42, true, -3.0f, 3.0f);
  std::vector<double> ref;
  for (float v : x.values()) ref.push_back(1.0 / (1.0 + std::exp(-static_cast<double>(v))));
  expect_forward(ops::sigmoid(x), ref, 1e-6, 1e-7);
  gradcheck([](const std::vector<Tensor>& in) { return ops::sigmoid(in[0]); }, {x});
}

TEST(GradCheck, SigmoidSaturatesWithoutNan) {
  const std::vector<float> v{-100.0f, -30.0f, 0.0f, 30.0f, 100.0f};
  const Tensor y = ops::sigmoid(Tensor::from_data({5}, v));
  EXPECT_EQ(y.data()[0], 0.0f);
  EXPECT_EQ(y.data()[2], 0.5f);
  EXPECT_EQ(y.data()[4], 1.0f);
  for (float out : y.values()) EXPECT_TRUE(std::isfinite(out));
}

// ---- reshape, flatten, sum ------------------------------------------------------------------

TEST(GradCheck, Reshape) {
  const Tensor x = random_tensor({2, 3, 4}, 50);
  const Tensor y = ops::reshape(x, {4, 6});
  EXPECT_EQ(y.shape(), (Shape{4, 6}));
  expect_forward(y, std::vector<double>(x.values().begin(), x.values().end()), 0.0, 0.0);
  gradcheck([](const std::vector<Tensor>& in) { return ops::reshape(in[0], {4, 6}); }, {x});
  EXPECT_THROW(ops::reshape(x, {5, 5}), Error);
}

TEST(GradCheck, Flatten) {
  const Tensor x = random_tensor({2, 3, 2, 2}, 51);
  EXPECT_EQ(ops::flatten(x).shape(), (Shape{2, 12}));
  // Composed with tanh, so the gradient through the view is not the identity everywhere.
  gradcheck([](const std::vector<Tensor>& in) { return ops::flatten(ops::tanh(in[0])); }, {x});
}

TEST(GradCheck, Sum) {
  const Tensor x = random_tensor({3, 4}, 52);
  double ref = 0.0;
  for (float v : x.values()) ref += v;
  EXPECT_NEAR(ops::sum(x).item(), ref, 1e-6);
  gradcheck([](const std::vector<Tensor>& in) { return ops::sum(in[0]); }, {x});
}

// ---- losses ---------------------------------------------------------------------------------

// Mean over rows of logsumexp(z) - z[label], in double with the max shifted out.
double ce_closed_form(const std::vector<float>& z, const std::vector<int32_t>& labels, int64_t classes) {
  double total = 0.0;
  const int64_t batch = static_cast<int64_t>(labels.size());
  for (int64_t b = 0; b < batch; ++b) {
    double peak = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) peak = std::max<double>(peak, z[b * classes + c]);
    double s = 0.0;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(static_cast<double>(z[b * classes + c]) - peak);
    total += peak + std::log(s) - z[b * classes + labels[b]];
  }
  return total / static_cast<double>(batch);
}

TEST(GradCheck, CrossEntropy) {
  const std::vector<int32_t> labels{0, 5, 2, 3};
  const Tensor logits = random_tensor({4, 6}, 60, true, -2.0f, 2.0f);
  const std::vector<float> z(logits.values().begin(), logits.values().end());
  EXPECT_NEAR(ops::cross_entropy(logits, labels).item(), ce_closed_form(z, labels, 6), 1e-6);
  gradcheck([&labels](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], labels); }, {logits});
}

TEST(CrossEntropy, ExtremeLogitsStayFiniteAndMatchClosedForm) {
  const int64_t classes = 10;
  std::vector<float> z;
  // Rows 0-1: +-80 alternating (five tied maxima), label on a maximum / on a minimum.
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < classes; ++c) z.push_back(c % 2 == 0 ? 80.0f : -80.0f);
  // Rows 2-3: spread over [-1e4, 1e4] (exp overflows without the max shift); label not / at the argmax.
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < classes; ++c) z.push_back(-1e4f + 2e4f * static_cast<float>((c * 7) % 10) / 9.0f);
  // Row 4: all -80 (uniform); row 5: one +80 among -80 with the label elsewhere.
  for (int c = 0; c < classes; ++c) z.push_back(-80.0f);
  for (int c = 0; c < classes; ++c) z.push_back(c == 3 ? 80.0f : -80.0f);
  const std::vector<int32_t> labels{0, 1, 4, 7, 9, 5};  // row 3: (7*7)%10 = 9 -> the max

  const Tensor logits = Tensor::from_data({6, classes}, z, true);
  const Tensor loss = ops::cross_entropy(logits, labels);
  const double ref = ce_closed_form(z, labels, classes);
  ASSERT_TRUE(std::isfinite(loss.item()));
  EXPECT_NEAR(loss.item(), ref, 1e-6 * std::abs(ref));
  // Row by row: log 5, 160 + log 5, large, ~0, log 10, 160.
  EXPECT_NEAR(ce_closed_form({z.begin(), z.begin() + 10}, {0}, classes), std::log(5.0), 1e-12);
  EXPECT_NEAR(ce_closed_form({z.begin() + 10, z.begin() + 20}, {1}, classes), 160.0 + std::log(5.0), 1e-9);

  loss.backward();
  // d loss / d z = (softmax(z) - onehot) / B, computed in double.
  for (int64_t b = 0; b < 6; ++b) {
    double peak = -INFINITY, s = 0.0;
    for (int64_t c = 0; c < classes; ++c) peak = std::max<double>(peak, z[b * classes + c]);
    for (int64_t c = 0; c < classes; ++c) s += std::exp(z[b * classes + c] - peak);
    for (int64_t c = 0; c < classes; ++c) {
      const double expected = (std::exp(z[b * classes + c] - peak) / s - (c == labels[b] ? 1.0 : 0.0)) / 6.0;
      const float got = logits.grad()[b * classes + c];
      ASSERT_TRUE(std::isfinite(got)) << "row " << b << " class " << c;
      EXPECT_NEAR(got, expected, 1e-6 + 1e-5 * std::abs(expected)) << "row " << b << " class " << c;
    }
  }
}

TEST(CrossEntropy, RejectsBadLabelsAndShapes) {
  const Tensor logits = random_tensor({2, 3}, 61);
  const std::vector<int32_t> out_of_range{0, 3}, negative{-1, 0}, short_labels{0};
  EXPECT_THROW(ops::cross_entropy(logits, out_of_range), Error);
  EXPECT_THROW(ops::cross_entropy(logits, negative), Error);
  EXPECT_THROW(ops::cross_entropy(logits, short_labels), Error);
  autograd::clear_tape();
}

TEST(GradCheck, Mse) {
  const Tensor prediction = random_tensor({4, 3}, 70), target = random_tensor({4, 3}, 71, false);
  double ref = 0.0;
  for (int64_t i = 0; i < 12; ++i) {
    const double d = static_cast<double>(prediction.data()[i]) - target.data()[i];
    ref += d * d / 12.0;
  }
  EXPECT_NEAR(ops::mse(prediction, target).item(), ref, 1e-6);
  gradcheck([](const std::vector<Tensor>& in) { return ops::mse(in[0], in[1]); }, {prediction, target});
  EXPECT_FALSE(target.has_grad());
}

// ---- a small composite graph (ops chained, one parameter reused) ----------------------------

TEST(GradCheck, CompositeNetwork) {
  const Tensor x = random_tensor({2, 1, 6, 6}, 80, false);
  const Tensor w1 = random_tensor({3, 1, 3, 3}, 81), b1 = random_tensor({3}, 82);
  const Tensor w2 = random_tensor({4, 12}, 83), b2 = random_tensor({4}, 84);
  gradcheck(
      [x](const std::vector<Tensor>& in) {
        Tensor h = ops::tanh(ops::conv2d(x, in[0], in[1], {1, 0}));  // [2,3,4,4]
        h = ops::flatten(ops::maxpool2d(h, 2, 2));                   // [2,12]
        h = ops::sigmoid(ops::linear(h, in[2], in[3]));              // [2,4]
        return ops::add_bias(h, in[3]);                              // b2 used twice
      },
      {w1, b1, w2, b2});
}

// ---- dropout --------------------------------------------------------------------------------

TEST(Dropout, MaskScalingGradientRateAndReproducibility) {
  const float p = 0.3f;
  const int64_t n = 100000;
  Rng values(5);
  std::vector<float> v(n);
  for (float& e : v) e = values.uniform(0.5f, 1.5f) * (values.uniform() < 0.5f ? -1.0f : 1.0f);  // never 0
  const Tensor x = Tensor::from_data({100, 1000}, v, true);

  Rng rng(1234);
  autograd::clear_tape();
  const Tensor y = ops::dropout(x, p, rng);
  EXPECT_EQ(y.shape(), x.shape());
  const Projection projection(n, 7);
  projection.graph(y).backward();

  int64_t dropped = 0;
  int bad_value = 0, bad_grad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = y.data()[i] != 0.0f;
    dropped += !kept;
    const double expected = kept ? static_cast<double>(v[i]) / (1.0 - p) : 0.0;
    if (std::abs(y.data()[i] - expected) > 1e-6 * std::abs(expected)) ++bad_value;
    // The gradient is the same mask: w_i / (1 - p) where kept, 0 where dropped.
    const double expected_grad = kept ? static_cast<double>(projection.w[i]) / (1.0 - p) : 0.0;
    if (std::abs(x.grad()[i] - expected_grad) > 1e-6 * std::abs(expected_grad) + 1e-12) ++bad_grad;
  }
  EXPECT_EQ(bad_value, 0);
  EXPECT_EQ(bad_grad, 0);
  // Binomial(1e5, 0.3): standard deviation of the fraction 0.00145; 0.01 is ~7 sigma.
  EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.01);

  // Same seed, same mask; another seed, another mask.
  Rng same(1234), other(1235);
  std::vector<float> again, different;
  {
    NoGradGuard guard;
    const Tensor y2 = ops::dropout(x, p, same);
    again.assign(y2.values().begin(), y2.values().end());
    const Tensor y3 = ops::dropout(x, p, other);
    different.assign(y3.values().begin(), y3.values().end());
  }
  EXPECT_TRUE(std::equal(again.begin(), again.end(), y.values().begin()));
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) mismatches += (different[i] == 0.0f) != (y.data()[i] == 0.0f);
  EXPECT_GT(mismatches, n / 10);  // independent masks differ in ~2p(1-p) = 42% of places
  // The generator advanced: a second draw from the same Rng gives a different mask.
  std::vector<float> next;
  {
    NoGradGuard guard;
    const Tensor y4 = ops::dropout(x, p, rng);
    next.assign(y4.values().begin(), y4.values().end());
  }
  EXPECT_FALSE(std::equal(next.begin(), next.end(), y.values().begin()));
}

TEST(Dropout, ZeroProbabilityIsIdentityAndBadProbabilityThrows) {
  const Tensor x = random_tensor({4, 5}, 90, false);
  Rng rng(1);
  const Tensor y = ops::dropout(x, 0.0f, rng);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y.data()[i], x.data()[i]);
  EXPECT_THROW(ops::dropout(x, 1.0f, rng), Error);
  EXPECT_THROW(ops::dropout(x, -0.1f, rng), Error);
}

// ---- shape errors ---------------------------------------------------------------------------

TEST(OpErrors, MismatchedShapesThrow) {
  const Tensor a = random_tensor({2, 3}, 95, false), b = random_tensor({4, 2}, 96, false);
  EXPECT_THROW(ops::matmul(a, b), Error);
  EXPECT_THROW(ops::linear(a, b, Tensor()), Error);
  EXPECT_THROW(ops::add_bias(a, random_tensor({2}, 97, false)), Error);
  EXPECT_THROW(ops::conv2d(a, b, Tensor()), Error);
  const Tensor img = random_tensor({1, 2, 4, 4}, 98, false);
  EXPECT_THROW(ops::conv2d(img, random_tensor({3, 3, 3, 3}, 99, false), Tensor()), Error);  // channels
  EXPECT_THROW(ops::conv2d(img, random_tensor({3, 2, 5, 5}, 99, false), Tensor()), Error);  // too large
  EXPECT_THROW(ops::maxpool2d(img, 5, 1), Error);
  EXPECT_THROW(ops::mse(a, random_tensor({3, 2}, 100, false)), Error);
}

// conv2d with fuse_relu must be relu(conv2d(...)) exactly: the same float operations in the same
// order, forward and backward (the mask y > 0 equals pre-activation > 0). Chunking is exercised by a
// batch larger than one chunk of the second MNIST layer's geometry.
TEST(FusedConvRelu, EqualsConvThenReluBitwise) {
  for (const auto& [stride, pad] : {std::pair{1, 0}, std::pair{2, 1}}) {
    SCOPED_TRACE("stride " + std::to_string(stride) + " padding " + std::to_string(pad));
    const Tensor x = random_tensor({9, 32, 13, 13}, 11), w = random_tensor({64, 32, 3, 3}, 12),
                 b = random_tensor({64}, 13);
    const Tensor x2 = x.clone(), w2 = w.clone(), b2 = b.clone();
    for (const Tensor* t : {&x2, &w2, &b2}) t->set_requires_grad(true);
    const Tensor fused = ops::conv2d(x, w, b, {stride, pad, /*fuse_relu=*/true});
    const Tensor plain = ops::relu(ops::conv2d(x2, w2, b2, {stride, pad}));
    ASSERT_EQ(fused.shape(), plain.shape());
    for (int64_t i = 0; i < fused.numel(); ++i) ASSERT_EQ(fused.data()[i], plain.data()[i]) << "output " << i;
    const Projection p(fused.numel(), 14);
    p.graph(fused).backward();
    p.graph(plain).backward();
    for (const auto& [a, c] : {std::pair{&x, &x2}, std::pair{&w, &w2}, std::pair{&b, &b2}})
      for (int64_t i = 0; i < a->numel(); ++i) ASSERT_EQ(a->grad()[i], c->grad()[i]) << "gradient " << i;
  }
}

}  // namespace
}  // namespace dptrain
