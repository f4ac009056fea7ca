// tests/fixtures/resnet.safetensors (PyTorch 1.13 / torchvision 0.14, float32) against our layers:
// BatchNorm2d in training mode (output, input and affine gradients, running statistics, the batch
// counter) and in evaluation mode; torchvision's BasicBlock and Bottleneck with and without the
// downsample shortcut; and three SGD-momentum steps of resnet20, every parameter, buffer and
// momentum buffer compared at the end. Agreement: |ours - ref| <= 1e-5 |ref| + atol element-wise
// (atol 1e-6 for single ops, 1e-5 after three training steps, and at least 1e-6 of the tensor's
// largest magnitude; see tests/fixtures/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/parameters.h"
#include "core/safetensors.h"
#include "layers/build.h"
#include "layers/module.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"

namespace dptrain {
// gtest names the parameter in test listings ("cpu"), not as bytes; found by argument lookup.
void PrintTo(const Device& device, std::ostream* out) {
  *out << device.str();
}
}  // namespace dptrain

namespace dptrain::layers {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kScaleFloor = 1e-6;  // of a tensor's largest magnitude: see expect_close

const test_util::FixtureFile fixture("resnet.safetensors");

// The worst |ours - PyTorch| / max |PyTorch| over the tensors a test compared, printed at its end:
// the figure the acceptance criterion (1e-5 relative) is about.
double worst_tensor_relative = 0;
std::string worst_tensor;

void expect_close(const std::vector<float>& ours, const Tensor& ref, const std::string& what, double atol) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), ref.numel()) << what;
  double largest = 0, worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    largest = std::max(largest, std::abs(static_cast<double>(ref.data()[i])));
    worst = std::max(worst, std::abs(ours[i] - static_cast<double>(ref.data()[i])));
  }
  if (largest > 0 && worst / largest >= worst_tensor_relative) {
    worst_tensor_relative = worst / largest;
    worst_tensor = what;
  }
  // A float32 sum is off by a few ulps of its largest terms, and an element that cancels down to a
  // small value keeps that error: bottleneck_down's conv2 weight gradient [138] is 0.11 from terms
  // whose magnitudes add up to 71, in a tensor whose largest element is 84, and a build for AVX2
  // without AVX-512 (8-float vectors, another summation order) came 1.2e-5 from the float64 value (PyTorch:
  // 5e-7). So the absolute floor is at least 1e-6 of the tensor's largest magnitude (about 10 of its ulps).
  const double floor = std::max(atol, kScaleFloor * largest);
  int failures = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data()[i];
    if (!(std::abs(ours[i] - r) <= floor + kRtol * std::abs(r)) && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: ours " << ours[i] << " vs PyTorch " << r;
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << ref.numel() << " elements differ";
}

// Copies the fixture's tensors "<prefix><name>" into the module's parameters and buffers.
void load_state(const Module& module, const std::string& prefix) {
  for (const NamedTensor& t : state_tensors(module)) {
    const Tensor& source = fixture.get(prefix + t.name);
    ASSERT_EQ(source.shape(), t.tensor.shape()) << t.name;
    t.tensor.copy_from(source);
  }
}

// Backward of sum(y * gy).
void backward_with(const Tensor& y, const std::string& gy) {
  autograd::backward(y, fixture.get(gy));
}

class ResnetFixtures : public ::testing::Test {
 protected:
  void SetUp() override {
    autograd::clear_tape();
    worst_tensor_relative = 0;
    worst_tensor.clear();
  }
  void TearDown() override {
    std::printf("  worst |ours - PyTorch| / max |PyTorch| over the compared tensors: %.2e (%s)\n",
                worst_tensor_relative, worst_tensor.c_str());
  }
};

TEST_F(ResnetFixtures, BatchNormTrainingAndEvaluation) {
  BatchNorm2d bn("bn", fixture.get("bn.weight").numel());
  const std::vector<NamedTensor> params = bn.named_parameters(), buffers = bn.named_buffers();
  params[0].tensor.copy_from(fixture.get("bn.weight"));
  params[1].tensor.copy_from(fixture.get("bn.bias"));
  buffers[0].tensor.copy_from(fixture.get("bn.running_mean_before"));
  buffers[1].tensor.copy_from(fixture.get("bn.running_var_before"));
  Tensor x = fixture.get("bn.x").clone();
  x.set_requires_grad(true);
  const Tensor y = bn.forward(x);
  expect_close(y.to_vector(), fixture.get("bn.y"), "bn.y", 1e-6);
  backward_with(y, "bn.gy");
  expect_close({x.grad().begin(), x.grad().end()}, fixture.get("bn.gx"), "bn.gx", 1e-6);
  expect_close({params[0].tensor.grad().begin(), params[0].tensor.grad().end()}, fixture.get("bn.gweight"),
               "bn.gweight", 1e-6);
  expect_close({params[1].tensor.grad().begin(), params[1].tensor.grad().end()}, fixture.get("bn.gbias"),
               "bn.gbias", 1e-6);
  expect_close(buffers[0].tensor.to_vector(), fixture.get("bn.running_mean"), "bn.running_mean", 1e-6);
  expect_close(buffers[1].tensor.to_vector(), fixture.get("bn.running_var"), "bn.running_var", 1e-6);
  EXPECT_EQ(buffers[2].tensor.item(), fixture.get("bn.num_batches_tracked").item());

  bn.set_training(false);
  for (const NamedTensor& p : params) p.tensor.zero_grad();
  Tensor x_eval = fixture.get("bn.eval_x").clone();
  x_eval.set_requires_grad(true);
  const Tensor y_eval = bn.forward(x_eval);
  expect_close(y_eval.to_vector(), fixture.get("bn.eval_y"), "bn.eval_y", 1e-6);
  backward_with(y_eval, "bn.eval_gy");
  expect_close({x_eval.grad().begin(), x_eval.grad().end()}, fixture.get("bn.eval_gx"), "bn.eval_gx", 1e-6);
  expect_close({params[0].tensor.grad().begin(), params[0].tensor.grad().end()},
               fixture.get("bn.eval_gweight"), "bn.eval_gweight", 1e-6);
  expect_close({params[1].tensor.grad().begin(), params[1].tensor.grad().end()}, fixture.get("bn.eval_gbias"),
               "bn.eval_gbias", 1e-6);
  EXPECT_EQ(buffers[2].tensor.item(), fixture.get("bn.num_batches_tracked").item())
      << "evaluation counts no batch";
}

struct BlockCase {
  const char* name;
  ResidualBlock::Kind kind;
  int64_t in_channels, planes;
  int stride;
};

class BlockFixture : public ResnetFixtures, public ::testing::WithParamInterface<BlockCase> {};

TEST_P(BlockFixture, ForwardBackwardAndRunningStatistics) {
  const BlockCase& c = GetParam();
  const std::string p = std::string(c.name) + ".";
  ResidualBlock block(c.kind, c.name, c.in_channels, c.planes, c.stride);
  load_state(block, "");
  Tensor x = fixture.get(p + "x").clone();
  x.set_requires_grad(true);
  const Tensor y = block.forward(x);
  expect_close(y.to_vector(), fixture.get(p + "y"), p + "y", 1e-6);
  backward_with(y, p + "gy");
  expect_close({x.grad().begin(), x.grad().end()}, fixture.get(p + "gx"), p + "gx", 1e-6);
  for (const NamedTensor& t : block.named_parameters()) {
    const std::string key = t.name.substr(p.size());
    expect_close({t.tensor.grad().begin(), t.tensor.grad().end()}, fixture.get(p + "grad." + key),
                 t.name + " grad", 1e-5);
  }
  for (const NamedTensor& t : block.named_buffers())
    expect_close(t.tensor.to_vector(), fixture.get(p + "after." + t.name.substr(p.size())), t.name, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Torchvision, BlockFixture,
    ::testing::Values(BlockCase{"basic_down", ResidualBlock::Kind::kBasic, 4, 8, 2},
                      BlockCase{"basic_id", ResidualBlock::Kind::kBasic, 8, 8, 1},
                      BlockCase{"bottleneck_down", ResidualBlock::Kind::kBottleneck, 8, 4, 2},
                      BlockCase{"bottleneck_id", ResidualBlock::Kind::kBottleneck, 16, 4, 1}),
    [](const ::testing::TestParamInfo<BlockCase>& info) { return std::string(info.param.name); });

// On the CPU backend (the one users train with) and on the reference backend (sums in double).
class Resnet20Fixture : public ResnetFixtures, public ::testing::WithParamInterface<Device> {};

TEST_P(Resnet20Fixture, ThreeSgdMomentumSteps) {
  const Device device = GetParam();
  const Tensor& first = fixture.get("r20.step1.x");
  const Shape sample(first.shape().begin() + 1, first.shape().end());
  const auto model = build_architecture("resnet20", sample, fixture.get("r20.init.fc.bias").numel(), 0);
  load_state(*model, "r20.init.");
  const FlatParameters flat(model->named_parameters(), device);
  const FlatParameters buffers(model->named_buffers(), device);
  optim::Sgd sgd(flat, {.momentum = fixture.meta_float("r20.momentum"),
                        .weight_decay = fixture.meta_float("r20.weight_decay")});
  const Tensor& losses = fixture.get("r20.losses");
  for (int step = 1; step <= 3; ++step) {
    const std::string p = "r20.step" + std::to_string(step) + ".";
    std::vector<int32_t> labels;
    for (float v : fixture.get(p + "labels").values()) labels.push_back(static_cast<int32_t>(v));
    flat.zero_grad();
    const Tensor loss = ops::cross_entropy(model->forward(fixture.get(p + "x").to(device)), labels);
    EXPECT_NEAR(loss.item(), losses.data()[step - 1], 1e-5 * std::abs(losses.data()[step - 1]) + 1e-6)
        << "step " << step;
    loss.backward();
    sgd.step(fixture.meta_float("r20.lr"));
  }
  for (const NamedTensor& t : state_tensors(*model))
    expect_close(t.tensor.to_vector(), fixture.get("r20.final." + t.name), t.name, 1e-5);
  for (const NamedTensor& t : sgd.state()) {
    const std::string parameter = t.name.substr(0, t.name.size() - std::string(".momentum_buffer").size());
    expect_close(t.tensor.to_vector(), fixture.get("r20.momentum." + parameter), t.name, 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Resnet20Fixture, ::testing::Values(Device::cpu(), Device::reference()),
                         [](const ::testing::TestParamInfo<Device>& info) { return info.param.str(); });

}  // namespace
}  // namespace dptrain::layers
