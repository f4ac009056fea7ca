// SGD (momentum, Nesterov, dampening, weight decay), Adam (with L2) and AdamW against PyTorch 1.13:
// tests/fixtures/trajectories.safetensors holds the parameters after each of 10 full-batch steps of
// Linear(6,5)-ReLU-Linear(5,3) with cross entropy, and the loss before each step.
// Agreement: |ours - ref| <= 1e-5 * |ref| + 1e-6 for every parameter after every step, and the same
// for each step's loss.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/parameters.h"
#include "core/safetensors.h"
#include "layers/module.h"
#include "optim/optimizer.h"
#include "tests/optim/pytorch_steps.h"
#include "tests/test_util.h"

namespace dptrain {
namespace {

constexpr int kSteps = 10;

const test_util::FixtureFile fixture("trajectories.safetensors");

// The model of the fixture, parameters named as PyTorch names them, loaded from init.*, and its
// parameters in the flat buffers an optimizer updates.
struct Model {
  std::unique_ptr<layers::Sequential> net;
  std::unique_ptr<FlatParameters> flat;
  Tensor forward(const Tensor& x) { return net->forward(x); }
  std::vector<NamedTensor> named_parameters() const { return net->named_parameters(); }
};

std::unique_ptr<Model> make_model() {
  auto model = test_util::fixture_mlp(fixture);
  auto flat = std::make_unique<FlatParameters>(model->named_parameters(), Device::cpu());
  return std::make_unique<Model>(Model{std::move(model), std::move(flat)});
}

std::vector<int32_t> labels() {
  std::vector<int32_t> out;
  for (float v : fixture.get("data.labels").values()) out.push_back(static_cast<int32_t>(v));
  return out;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, const FlatParameters& params,
                                                 std::vector<FlatRange> owned = {}) {
  const std::string kind = fixture.meta(name + ".optimizer");
  if (kind == "SGD") {
    optim::SgdOptions o;
    o.momentum = fixture.meta_float(name + ".momentum");
    o.dampening = fixture.meta_float(name + ".dampening");
    o.nesterov = fixture.meta_bool(name + ".nesterov");
    o.weight_decay = fixture.meta_float(name + ".weight_decay");
    return std::make_unique<optim::Sgd>(params, o, owned);
  }
  if (kind != "Adam" && kind != "AdamW") throw Error("unknown optimizer '" + kind + "' in the fixture");
  optim::AdamOptions o;
  o.beta1 = fixture.meta_float(name + ".beta1");
  o.beta2 = fixture.meta_float(name + ".beta2");
  o.eps = fixture.meta_float(name + ".eps");
  o.weight_decay = fixture.meta_float(name + ".weight_decay");
  o.decoupled_weight_decay = kind == "AdamW";
  return std::make_unique<optim::Adam>(params, o, owned);
}

class Trajectory : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { autograd::clear_tape(); }
};

TEST_P(Trajectory, MatchesPyTorchAfterEveryStep) {
  const std::string name = GetParam();
  ASSERT_EQ(std::stoi(fixture.meta("steps")), kSteps);
  const auto model = make_model();
  const auto optimizer = make_optimizer(name, *model->flat);
  const float lr = fixture.meta_float(name + ".lr");
  const Tensor& x = fixture.get("data.x");
  const std::vector<int32_t> y = labels();
  const Tensor& ref_losses = fixture.get(name + ".losses");
  ASSERT_EQ(ref_losses.numel(), kSteps);

  for (int step = 1; step <= kSteps; ++step) {
    optimizer->zero_grad();
    const Tensor loss = ops::cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer->step(lr);
    EXPECT_EQ(optimizer->steps_taken(), step);
    EXPECT_TRUE(test_util::close_to_pytorch(loss.item(), ref_losses.data()[step - 1]))
        << "step " << step << " loss " << loss.item() << " vs PyTorch " << ref_losses.data()[step - 1];
    ASSERT_NO_FATAL_FAILURE(test_util::expect_step_matches(fixture, name, step, model->named_parameters()));
  }
  // The run must have moved the parameters (the comparison is not vacuous).
  EXPECT_NE(model->named_parameters()[0].tensor.data()[0], fixture.get("init.0.weight").data()[0]);
}

// ZeRO-1 in one process: three optimizers over disjoint ranges that together cover the flat buffers
// (as three ranks' shards do, ranges cutting through tensors) take the same steps as one optimizer
// over everything, bit for bit, and their state gathered into the flat layout is its state.
TEST_P(Trajectory, ShardsTogetherTakeTheWholeOptimizersStepsBitForBit) {
  const std::string name = GetParam();
  const auto whole_model = make_model(), sharded_model = make_model();
  const int64_t size = sharded_model->flat->size();
  const std::vector<std::vector<FlatRange>> shards = {
      {{0, 7}, {40, size - 40}}, {{7, 13}}, {{20, 20}}};  // 7 + 13 + 20 + (size - 40) = size
  const auto whole = make_optimizer(name, *whole_model->flat);
  std::vector<std::unique_ptr<optim::Optimizer>> parts;
  for (const auto& owned : shards) parts.push_back(make_optimizer(name, *sharded_model->flat, owned));
  const float lr = fixture.meta_float(name + ".lr");
  for (int step = 1; step <= kSteps; ++step) {
    for (Model* m : {whole_model.get(), sharded_model.get()}) {
      autograd::clear_tape();
      m->flat->zero_grad();
      ops::cross_entropy(m->forward(fixture.get("data.x")), labels()).backward();
    }
    whole->step(lr);
    for (const auto& part : parts) part->step(lr);
    ASSERT_TRUE(test_util::bitwise_equal(whole_model->flat->values().values(),
                                         sharded_model->flat->values().values()))
        << name << ": step " << step;
  }
  // The state: each part's ranges in the flat layout, zeros elsewhere; together, the whole one's.
  const std::vector<Tensor>& expected = whole->state_buffers();
  std::vector<std::vector<float>> gathered(expected.size(),
                                           std::vector<float>(static_cast<std::size_t>(size)));
  int64_t state_bytes = 0;
  for (const auto& part : parts) {
    EXPECT_TRUE(part->sharded());
    state_bytes += part->state_bytes();
    const std::vector<Tensor> mine = part->whole_state_buffers();
    for (std::size_t s = 0; s < mine.size(); ++s)
      for (int64_t i = 0; i < size; ++i) gathered[s][static_cast<std::size_t>(i)] += mine[s].data()[i];
  }
  EXPECT_EQ(state_bytes, whole->state_bytes());
  for (std::size_t s = 0; s < expected.size(); ++s)
    EXPECT_TRUE(test_util::bitwise_equal(expected[s].values(), gathered[s])) << name << ": slot " << s;
  // And back: a fresh part takes its ranges of the whole state (a resume into a sharded run).
  const auto resumed = make_optimizer(name, *sharded_model->flat, shards[1]);
  resumed->take_state_from(whole->whole_state_buffers());
  for (std::size_t s = 0; s < expected.size(); ++s)
    EXPECT_TRUE(
        test_util::bitwise_equal(resumed->state_buffers()[s].values(), parts[1]->state_buffers()[s].values()))
        << name << ": slot " << s << " taken from the whole state";
  EXPECT_THROW(parts[0]->state(), Error);  // a sharded state is gathered before it is named
}

INSTANTIATE_TEST_SUITE_P(Fixture, Trajectory,
                         ::testing::Values("sgd_momentum", "sgd_nesterov", "sgd_dampening", "adam", "adam_wd",
                                           "adamw"));

// ---- optimizer state by name ----------------------------------------------------------------

// One step on the fixture's problem; returns the gradients it used (still in the parameters).
std::vector<std::vector<float>> one_step(Model& model, optim::Optimizer& optimizer, float lr) {
  autograd::clear_tape();
  optimizer.zero_grad();
  ops::cross_entropy(model.forward(fixture.get("data.x")), labels()).backward();
  std::vector<std::vector<float>> grads;
  for (const NamedTensor& p : model.named_parameters())
    grads.emplace_back(p.tensor.grad().begin(), p.tensor.grad().end());
  optimizer.step(lr);
  return grads;
}

TEST(OptimizerState, AdamStateIsAddressableByName) {
  const auto model = make_model();
  optim::AdamOptions o;
  o.beta1 = 0.9f;
  o.beta2 = 0.99f;
  optim::Adam adam(*model->flat, o);
  const Tensor m = adam.state_of("0.weight", "exp_avg");
  const Tensor v = adam.state_of("2.bias", "exp_avg_sq");
  ASSERT_TRUE(m.defined());
  ASSERT_TRUE(v.defined());
  EXPECT_EQ(m.shape(), (Shape{5, 6}));
  EXPECT_EQ(v.shape(), (Shape{3}));
  EXPECT_FALSE(adam.state_of("0.weight", "momentum_buffer").defined());
  EXPECT_FALSE(adam.state_of("5.weight", "exp_avg").defined());

  const auto grads = one_step(*model, adam, 1e-3f);
  // After one step from zero state: exp_avg = (1 - beta1) g, exp_avg_sq = (1 - beta2) g^2.
  for (int64_t i = 0; i < m.numel(); ++i)
    EXPECT_NEAR(m.data()[i], 0.1 * grads[0][i], 1e-7 + 1e-6 * std::abs(grads[0][i]));
  for (int64_t i = 0; i < v.numel(); ++i)
    EXPECT_NEAR(v.data()[i], 0.01 * grads[3][i] * grads[3][i], 1e-12 + 1e-5 * grads[3][i] * grads[3][i]);

  std::vector<std::string> names;
  for (const NamedTensor& s : adam.state()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight.exp_avg", "0.bias.exp_avg", "2.weight.exp_avg",
                                             "2.bias.exp_avg", "0.weight.exp_avg_sq", "0.bias.exp_avg_sq",
                                             "2.weight.exp_avg_sq", "2.bias.exp_avg_sq"}));
  // state() hands out the live tensors: what a checkpoint restore writes into them is used.
  EXPECT_EQ(adam.state()[0].tensor.data(), m.data());
}

TEST(OptimizerState, SgdWithoutMomentumHasNoState) {
  const auto model = make_model();
  optim::Sgd sgd(*model->flat, {});
  EXPECT_TRUE(sgd.state().empty());
  EXPECT_FALSE(sgd.state_of("0.weight", "momentum_buffer").defined());
  // Plain SGD: p <- p - lr g.
  std::vector<std::vector<float>> before;
  for (const NamedTensor& p : model->named_parameters())
    before.emplace_back(p.tensor.values().begin(), p.tensor.values().end());
  const auto grads = one_step(*model, sgd, 0.5f);
  const auto params = model->named_parameters();
  for (std::size_t k = 0; k < params.size(); ++k)
    for (int64_t i = 0; i < params[k].tensor.numel(); ++i)
      EXPECT_NEAR(params[k].tensor.data()[i], before[k][i] - 0.5 * grads[k][i], 1e-6) << params[k].name;
  EXPECT_TRUE(sgd.state().empty());
}

TEST(OptimizerState, SgdMomentumBufferStartsAsTheDecayedGradient) {
  const auto model = make_model();
  optim::SgdOptions o;
  o.momentum = 0.9f;
  o.dampening = 0.5f;
  o.weight_decay = 0.1f;
  optim::Sgd sgd(*model->flat, o);
  ASSERT_EQ(sgd.state().size(), 4u);
  EXPECT_EQ(sgd.state()[0].name, "0.weight.momentum_buffer");
  const Tensor buf = sgd.state_of("2.weight", "momentum_buffer");
  ASSERT_TRUE(buf.defined());
  const std::vector<float> p0(model->named_parameters()[2].tensor.values().begin(),
                              model->named_parameters()[2].tensor.values().end());
  const auto grads = one_step(*model, sgd, 0.1f);
  // PyTorch: the first step sets buf = g + wd p, with no dampening.
  for (int64_t i = 0; i < buf.numel(); ++i) EXPECT_NEAR(buf.data()[i], grads[2][i] + 0.1 * p0[i], 1e-6);
}

TEST(OptimizerState, ZeroGradAndInvalidOptions) {
  const auto model = make_model();
  optim::Sgd sgd(*model->flat, {});
  one_step(*model, sgd, 0.1f);
  sgd.zero_grad();
  for (const NamedTensor& p : model->named_parameters())
    for (float g : p.tensor.grad()) EXPECT_EQ(g, 0.0f) << p.name;
  optim::SgdOptions bad;
  bad.nesterov = true;  // needs momentum > 0
  EXPECT_THROW(optim::Sgd(*model->flat, bad), Error);
  bad.momentum = 0.9f;
  bad.dampening = 0.1f;  // and no dampening
  EXPECT_THROW(optim::Sgd(*model->flat, bad), Error);
  EXPECT_THROW(FlatParameters({{"undefined", Tensor()}}, Device::cpu()), Error);
}

// Resuming from saved state (tensors written in place, then set_steps_taken) continues exactly.
TEST(OptimizerState, RestoredStateContinuesTheTrajectory) {
  const std::string name = "adamw";
  const auto model = make_model();
  const auto optimizer = make_optimizer(name, *model->flat);
  const float lr = fixture.meta_float(name + ".lr");
  for (int k = 0; k < 4; ++k) one_step(*model, *optimizer, lr);

  // A second model/optimizer pair restored from the first one's parameters, state and step count.
  const auto resumed = make_model();
  const auto resumed_opt = make_optimizer(name, *resumed->flat);
  for (std::size_t i = 0; i < model->named_parameters().size(); ++i)
    std::copy_n(model->named_parameters()[i].tensor.data(), model->named_parameters()[i].tensor.numel(),
                resumed->named_parameters()[i].tensor.data());
  const auto from = optimizer->state(), to = resumed_opt->state();
  ASSERT_EQ(from.size(), to.size());
  for (std::size_t i = 0; i < from.size(); ++i)
    std::copy_n(from[i].tensor.data(), from[i].tensor.numel(), to[i].tensor.data());
  resumed_opt->set_steps_taken(optimizer->steps_taken());

  for (int k = 5; k <= kSteps; ++k) one_step(*resumed, *resumed_opt, lr);
  for (const NamedTensor& p : resumed->named_parameters()) {
    const Tensor& ref = fixture.get(name + ".step10." + p.name);
    for (int64_t i = 0; i < ref.numel(); ++i)
      EXPECT_TRUE(test_util::close_to_pytorch(p.tensor.data()[i], ref.data()[i]))
          << p.name << "[" << i << "]";
  }
}

}  // namespace
}  // namespace dptrain
