// Every case of tests/fixtures/layers.safetensors (PyTorch 1.13, float32) against our ops: the
// forward output y and the vector-Jacobian products of the objective sum(y * gy).
// Agreement: |ours - ref| <= 1e-5 * |ref| + 1e-6 element-wise; the cross-entropy loss within 1e-5
// relative (see tests/fixtures/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "layers/module.h"
#include "tests/test_util.h"

namespace dptrain {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

const test_util::FixtureFile fixture("layers.safetensors");

// A fresh copy that requires grad (the fixture's own tensors stay untouched).
Tensor leaf(const std::string& name) {
  Tensor t = fixture.get(name).clone();
  t.set_requires_grad(true);
  return t;
}

std::vector<int32_t> labels(const std::string& name) {
  std::vector<int32_t> out;
  for (float v : fixture.get(name).values()) out.push_back(static_cast<int32_t>(v));
  return out;
}

void expect_close(std::span<const float> ours, const Tensor& ref, const std::string& what,
                  double rtol = kRtol, double atol = kAtol) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), ref.numel()) << what;
  int failures = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data()[i], o = ours[i];
    const double err = std::abs(o - r);
    worst = std::max(worst, err / (atol + rtol * std::abs(r)));
    if (!(err <= atol + rtol * std::abs(r)) && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: ours " << o << " vs PyTorch " << r;
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << ref.numel()
                         << " elements outside tolerance";
  ::testing::Test::RecordProperty(what + "_worst_over_tolerance", std::to_string(worst));
}

// Runs y = f(), checks y, then backward of sum(y * gy) and each input's gradient.
void check_vjp(const std::string& prefix, const Tensor& y,
               const std::vector<std::pair<std::string, Tensor>>& inputs) {
  const Tensor ref_y = fixture.get(prefix + "y");
  ASSERT_EQ(y.shape(), ref_y.shape()) << prefix << "y";
  expect_close(y.values(), ref_y, prefix + "y");
  // sum(y * gy) as a graph: flatten y to [1, n] and project with gy as a [1, n] weight.
  const Tensor gy = fixture.get(prefix + "gy").view({1, y.numel()});
  ops::sum(ops::linear(ops::reshape(y, {1, y.numel()}), gy, Tensor())).backward();
  for (const auto& [name, input] : inputs) {
    ASSERT_TRUE(input.has_grad()) << prefix << name;
    const Tensor ref_g = fixture.get(prefix + "g" + name);
    ASSERT_EQ(input.shape(), ref_g.shape()) << prefix << "g" << name;
    expect_close(input.grad(), ref_g, prefix + "g" + name);
  }
}

class LayerFixtures : public ::testing::Test {
 protected:
  void SetUp() override { autograd::clear_tape(); }
};

TEST_F(LayerFixtures, Dense) {
  const Tensor x = leaf("dense.x"), w = leaf("dense.weight"), b = leaf("dense.bias");
  check_vjp("dense.", ops::linear(x, w, b), {{"x", x}, {"weight", w}, {"bias", b}});
}

TEST_F(LayerFixtures, DenseLayerModule) {
  // Through the Dense module, with the fixture's weights copied into its parameters.
  layers::Dense dense("0", 5, 3, true);
  std::copy_n(fixture.get("dense.weight").data(), 15, dense.weight().data());
  std::copy_n(fixture.get("dense.bias").data(), 3, dense.bias().data());
  const Tensor x = leaf("dense.x");
  check_vjp("dense.", dense.forward(x), {{"x", x}, {"weight", dense.weight()}, {"bias", dense.bias()}});
}

class ConvFixture : public LayerFixtures, public ::testing::WithParamInterface<std::string> {};

TEST_P(ConvFixture, ForwardAndVjp) {
  const std::string name = GetParam(), p = name + ".";
  const Tensor x = leaf(p + "x"), w = leaf(p + "weight"), b = leaf(p + "bias");
  ASSERT_EQ(w.dim(2), fixture.meta_int(p + "kernel"));
  const Tensor y = ops::conv2d(x, w, b, {fixture.meta_int(p + "stride"), fixture.meta_int(p + "padding")});
  check_vjp(p, y, {{"x", x}, {"weight", w}, {"bias", b}});
}

TEST_P(ConvFixture, Conv2DLayerModule) {
  const std::string name = GetParam(), p = name + ".";
  const Tensor w = fixture.get(p + "weight");
  layers::Conv2D conv("3", w.dim(1), w.dim(0), fixture.meta_int(p + "kernel"), fixture.meta_int(p + "stride"),
                      fixture.meta_int(p + "padding"), true);
  std::copy_n(w.data(), w.numel(), conv.weight().data());
  std::copy_n(fixture.get(p + "bias").data(), w.dim(0), conv.bias().data());
  const Tensor x = leaf(p + "x");
  const Shape per_sample(x.shape().begin() + 1, x.shape().end());
  const Shape expected_out(fixture.get(p + "y").shape().begin() + 1, fixture.get(p + "y").shape().end());
  EXPECT_EQ(conv.output_shape(per_sample), expected_out);
  check_vjp(p, conv.forward(x), {{"x", x}, {"weight", conv.weight()}, {"bias", conv.bias()}});
}

INSTANTIATE_TEST_SUITE_P(Conv, ConvFixture, ::testing::Values("conv_s1p0", "conv_s2p1", "conv_k5s1p2"));

class PoolFixture : public LayerFixtures, public ::testing::WithParamInterface<std::string> {};

TEST_P(PoolFixture, ForwardAndVjp) {
  const std::string p = GetParam() + ".";
  const Tensor x = leaf(p + "x");
  const int k = fixture.meta_int(p + "kernel"), s = fixture.meta_int(p + "stride");
  layers::MaxPool2D pool(k, s);
  const Shape per_sample(x.shape().begin() + 1, x.shape().end());
  const Shape expected_out(fixture.get(p + "y").shape().begin() + 1, fixture.get(p + "y").shape().end());
  EXPECT_EQ(pool.output_shape(per_sample), expected_out);
  check_vjp(p, pool.forward(x), {{"x", x}});
}

INSTANTIATE_TEST_SUITE_P(Pool, PoolFixture,
                         ::testing::Values("maxpool_k2s2", "maxpool_k3s2", "maxpool_ties",
                                           "maxpool_ties_overlap"));

TEST_F(LayerFixtures, Relu) {
  const Tensor x = leaf("relu.x");
  ASSERT_EQ(x.data()[0 * 7 + 1], 0.0f);
  ASSERT_EQ(x.data()[2 * 7 + 4], 0.0f);
  check_vjp("relu.", ops::relu(x), {{"x", x}});
  EXPECT_EQ(x.grad()[0 * 7 + 1], 0.0f) << "relu'(0) = 0";
  EXPECT_EQ(x.grad()[2 * 7 + 4], 0.0f) << "relu'(0) = 0";
}

TEST_F(LayerFixtures, Tanh) {
  const Tensor x = leaf("tanh.x");
  layers::ActivationLayer layer(layers::Activation::kTanh);
  check_vjp("tanh.", layer.forward(x), {{"x", x}});
}

TEST_F(LayerFixtures, Sigmoid) {
  const Tensor x = leaf("sigmoid.x");
  layers::ActivationLayer layer(layers::Activation::kSigmoid);
  check_vjp("sigmoid.", layer.forward(x), {{"x", x}});
}

TEST_F(LayerFixtures, CrossEntropy) {
  const Tensor logits = leaf("ce.logits");
  const std::vector<int32_t> y = labels("ce.labels");
  ASSERT_EQ(y.size(), 6u);
  const Tensor loss = ops::cross_entropy(logits, y);
  const float ref = fixture.get("ce.loss").item();
  ASSERT_TRUE(std::isfinite(loss.item()));
  EXPECT_NEAR(loss.item(), ref, 1e-5 * std::abs(ref)) << "loss";
  loss.backward();
  for (float g : logits.grad()) ASSERT_TRUE(std::isfinite(g));
  expect_close(logits.grad(), fixture.get("ce.glogits"), "ce.glogits");
}

TEST_F(LayerFixtures, Mse) {
  const Tensor prediction = leaf("mse.prediction");
  const Tensor target = fixture.get("mse.target");
  const Tensor loss = ops::mse(prediction, target);
  const float ref = fixture.get("mse.loss").item();
  EXPECT_NEAR(loss.item(), ref, kRtol * std::abs(ref) + kAtol) << "loss";
  loss.backward();
  expect_close(prediction.grad(), fixture.get("mse.gprediction"), "mse.gprediction");
}

// Every case in the file is exercised above (a new fixture case must get a test here).
TEST(LayerFixtureCoverage, EveryPrefixIsKnown) {
  const std::vector<std::string> known{
      "dense.",        "conv_s1p0.",    "conv_s2p1.",    "conv_k5s1p2.",
      "maxpool_k2s2.", "maxpool_k3s2.", "maxpool_ties.", "maxpool_ties_overlap.",
      "relu.",         "tanh.",         "sigmoid.",      "ce.",
      "mse."};
  for (const NamedTensor& t : fixture.file().tensors) {
    bool found = false;
    for (const std::string& k : known) {
      // "maxpool_ties." must not swallow "maxpool_ties_overlap.": match the longest prefix exactly.
      if (t.name.rfind(k, 0) == 0 && t.name.find('.', k.size()) == std::string::npos) found = true;
    }
    EXPECT_TRUE(found) << "fixture tensor '" << t.name << "' belongs to no tested case";
  }
}

}  // namespace
}  // namespace dptrain
