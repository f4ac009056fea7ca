// Gradient clipping (optim/clip.h): the factor and the sum of squares against closed forms, and 10
// steps of SGD-momentum and Adam with clipping against PyTorch's clip_grad_norm_
// (tests/fixtures/clipping.safetensors): the norm before each step's clipping, and every parameter
// after the step, within 1e-5 relative + 1e-6.
#include "optim/clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/parameters.h"
#include "layers/module.h"
#include "optim/optimizer.h"
#include "tests/optim/pytorch_steps.h"
#include "tests/test_util.h"

namespace dptrain::optim {
namespace {

TEST(ClipFactor, IsMaxNormOverNormPlusEpsilonAtMostOne) {
  EXPECT_FLOAT_EQ(clip_factor(5.0, 1.0), static_cast<float>(1.0 / (5.0 + 1e-6)));
  EXPECT_FLOAT_EQ(clip_factor(4.0, 2.0), static_cast<float>(2.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_factor(0.0, 1.0), 1.0f);
  // At norm == max_norm the epsilon makes the factor just below 1, as in PyTorch.
  EXPECT_LT(clip_factor(1.0, 1.0), 1.0f);
  // Inf and NaN norms are left to the finiteness check.
  EXPECT_EQ(clip_factor(std::numeric_limits<double>::infinity(), 1.0), 1.0f);
  EXPECT_EQ(clip_factor(std::numeric_limits<double>::quiet_NaN(), 1.0), 1.0f);
}

// Two parameters with hand-set gradients; ranges that cut through them.
TEST(ClipGradients, SumOfSquaresCoversExactlyTheRanges) {
  const Tensor a = Tensor::from_data({2}, std::vector<float>(2, 0.0f), true),
               b = Tensor::from_data({3}, std::vector<float>(3, 0.0f), true);
  FlatParameters flat({{"a", a}, {"b", b}}, Device::cpu());
  const std::vector<float> ga = {3.0f, 4.0f}, gb = {1.0f, 2.0f, 2.0f};
  std::copy(ga.begin(), ga.end(), flat.grads().data_ptr() + flat.offset(0));
  std::copy(gb.begin(), gb.end(), flat.grads().data_ptr() + flat.offset(1));
  const std::vector<FlatRange> whole{{0, flat.size()}};
  EXPECT_EQ(gradient_sum_of_squares(flat, whole), 25.0 + 9.0);
  const std::vector<FlatRange> parts{{flat.offset(0), 1}, {flat.offset(1) + 1, 2}};  // 3, then 2 and 2
  EXPECT_EQ(gradient_sum_of_squares(flat, parts), 9.0 + 8.0);
}

const test_util::FixtureFile fixture("clipping.safetensors");

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const FlatParameters& flat) {
  if (fixture.meta(name + ".optimizer") == "SGD")
    return std::make_unique<Sgd>(flat, SgdOptions{.momentum = fixture.meta_float(name + ".momentum")});
  return std::make_unique<Adam>(flat, AdamOptions{.beta1 = fixture.meta_float(name + ".beta1"),
                                                  .beta2 = fixture.meta_float(name + ".beta2"),
                                                  .eps = fixture.meta_float(name + ".eps")});
}

class ClippedTrajectory : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { autograd::clear_tape(); }
};

TEST_P(ClippedTrajectory, MatchesPyTorchsClipGradNormAfterEveryStep) {
  const std::string name = GetParam();
  const int steps = fixture.meta_int("steps");
  const double max_norm = fixture.meta_float(name + ".max_norm");
  // The fixture exercises both sides of the clip.
  ASSERT_GT(fixture.meta_int(name + ".clipped_steps"), 0);
  ASSERT_LT(fixture.meta_int(name + ".clipped_steps"), steps);
  const auto model = test_util::fixture_mlp(fixture);
  FlatParameters flat(model->named_parameters(), Device::cpu());
  const auto optimizer = make_optimizer(name, flat);
  const float lr = fixture.meta_float(name + ".lr");
  const Tensor& x = fixture.get("data.x");
  std::vector<int32_t> labels;
  for (float v : fixture.get("data.labels").values()) labels.push_back(static_cast<int32_t>(v));
  const Tensor& ref_norms = fixture.get(name + ".norms");
  const std::vector<FlatRange> whole{{0, flat.size()}};
  int clipped = 0;
  for (int step = 1; step <= steps; ++step) {
    optimizer->zero_grad();
    ops::cross_entropy(model->forward(x), labels).backward();
    const double norm = std::sqrt(gradient_sum_of_squares(flat, whole));
    EXPECT_TRUE(test_util::close_to_pytorch(norm, ref_norms.data()[step - 1]))
        << "step " << step << " norm " << norm << " vs PyTorch " << ref_norms.data()[step - 1];
    const float factor = clip_factor(norm, max_norm);
    clipped += factor < 1.0f;
    optimizer->step(lr, factor);
    ASSERT_NO_FATAL_FAILURE(test_util::expect_step_matches(fixture, name, step, model->named_parameters()));
  }
  EXPECT_EQ(clipped, fixture.meta_int(name + ".clipped_steps"));
}

INSTANTIATE_TEST_SUITE_P(PyTorch, ClippedTrajectory, ::testing::Values("sgd_clipped", "adam_clipped"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dptrain::optim
