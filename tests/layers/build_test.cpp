// Building models from the config's layer list: names and shapes as PyTorch, initialisers and their
// statistics, seeding, errors naming the key path, and loading weights by name.
#include "layers/build.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/config_reader.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "layers/module.h"
#include "tests/test_util.h"

namespace dptrain::layers {
namespace {

Json mnist_config() {
  std::ifstream in(std::string(DPTRAIN_SOURCE_DIR) + "/configs/mnist.json");
  EXPECT_TRUE(in) << "configs/mnist.json not found";
  return Json::parse(in);
}

std::unique_ptr<Sequential> build_mnist(uint64_t seed) {
  const Json config = mnist_config();
  return build_sequential(config["model"]["layers"], config["model"]["input_shape"].get<Shape>(), seed);
}

using test_util::expect_error;
using test_util::temp_path;

TEST(BuildSequential, MnistCnnHasPyTorchNamesAndShapes) {
  const auto model = build_mnist(42);
  const std::vector<NamedTensor> params = model->named_parameters();
  const std::vector<std::string> names{"0.weight", "0.bias", "3.weight", "3.bias",
                                       "7.weight", "7.bias", "9.weight", "9.bias"};
  const std::vector<Shape> shapes{{32, 1, 3, 3}, {32}, {64, 32, 3, 3}, {64},
                                  {64, 1600},    {64}, {10, 64},       {10}};
  ASSERT_EQ(params.size(), names.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, names[i]);
    EXPECT_EQ(params[i].tensor.shape(), shapes[i]) << names[i];
    EXPECT_TRUE(params[i].tensor.requires_grad()) << names[i];
  }
  EXPECT_EQ(parameter_count(*model), 121930);
  EXPECT_EQ(model->size(), 10u);
  EXPECT_EQ(model->output_shape({1, 28, 28}), (Shape{10}));
}

TEST(BuildSequential, MnistCnnForwardShapes) {
  const auto model = build_mnist(42);
  const Tensor x = Tensor::full({2, 1, 28, 28}, 0.5f);
  NoGradGuard guard;
  const Tensor y = model->forward(x);
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
  for (float v : y.values()) EXPECT_TRUE(std::isfinite(v));
  // The two samples are identical, so are their logits.
  for (int c = 0; c < 10; ++c) EXPECT_EQ(y.data()[c], y.data()[10 + c]);
}

TEST(BuildSequential, MnistCnnFusesConvReluPoolAndCountsItsArithmetic) {
  const auto model = build_mnist(42);
  const std::string description = model->describe();
  const std::string fused_pool = "MaxPool2D(2, stride 2) (fused into the convolution before)";
  std::size_t fused_pools = 0;
  for (std::size_t at = description.find(fused_pool); at != std::string::npos;
       at = description.find(fused_pool, at + 1))
    ++fused_pools;
  EXPECT_EQ(fused_pools, 2u) << description;
  // 26*26*32*9 + 11*11*64*288 + 1600*64 + 64*10 multiply-adds per sample.
  EXPECT_EQ(model->multiply_adds({1, 28, 28}), 2528000);

  // A pooling straight after a convolution (no ReLU between) is not fused.
  const Json layers = Json::parse(R"([{"type": "conv2d", "out_channels": 4, "kernel": 3},
                                      {"type": "maxpool2d", "kernel": 2}, {"type": "relu"}])");
  const auto unfused = build_sequential(layers, {1, 8, 8}, 1);
  EXPECT_EQ(unfused->describe().find("fused"), std::string::npos) << unfused->describe();
}

// PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases alike.
TEST(BuildSequential, DefaultInitBoundsAndStatistics) {
  const auto model = build_mnist(42);
  const std::map<std::string, int64_t> fan_in{{"0", 1 * 3 * 3}, {"3", 32 * 3 * 3}, {"7", 1600}, {"9", 64}};
  for (const NamedTensor& p : model->named_parameters()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in.at(p.name.substr(0, 1))));
    const double n = static_cast<double>(p.tensor.numel());
    double sum = 0, sq = 0, largest = 0;
    for (float v : p.tensor.values()) {
      ASSERT_LE(std::abs(v), bound * (1 + 1e-6)) << p.name;
      sum += v;
      sq += static_cast<double>(v) * v;
      largest = std::max(largest, std::abs(static_cast<double>(v)));
    }
    const double mean = sum / n, std_dev = std::sqrt(sq / n - mean * mean);
    const double expected_std = bound / std::sqrt(3.0);
    // Sampling error of a uniform's standard deviation: ~0.447/sqrt(n) relative; allow 5 sigma.
    EXPECT_NEAR(std_dev, expected_std, expected_std * 5 * 0.447 / std::sqrt(n)) << p.name;
    EXPECT_NEAR(mean, 0.0, 5 * expected_std / std::sqrt(n)) << p.name;
    // The range is really used: P(max |v| < bound (1 - 10/n)) ~ e^-10.
    EXPECT_GE(largest, bound * (1 - 10 / n)) << p.name;
  }
}

TEST(BuildSequential, SeedDeterminesValues) {
  const auto a = build_mnist(42), b = build_mnist(42), c = build_mnist(43);
  const auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(
        std::equal(pa[i].tensor.values().begin(), pa[i].tensor.values().end(), pb[i].tensor.values().begin()))
        << pa[i].name << " differs between two builds with the same seed";
    int64_t same = 0;
    for (int64_t k = 0; k < pa[i].tensor.numel(); ++k)
      same += pa[i].tensor.data()[k] == pc[i].tensor.data()[k];
    EXPECT_LT(same, std::max<int64_t>(1, pa[i].tensor.numel() / 100)) << pa[i].name << " ignores the seed";
  }
  // Each parameter draws from its own stream: scaled to [-1, 1], 0.weight and 3.weight do not coincide.
  const double b0 = 1.0 / 3.0, b3 = 1.0 / std::sqrt(288.0);
  int coincide = 0;
  for (int k = 0; k < 9; ++k)
    coincide += std::abs(pa[0].tensor.data()[k] / b0 - pa[2].tensor.data()[k] / b3) < 1e-5;
  EXPECT_LT(coincide, 9);
}

TEST(BuildSequential, NamedInitializers) {
  const Json layers = Json::parse(R"([
    {"type": "conv2d", "out_channels": 4, "kernel": 3, "weight_init": "glorot_uniform", "bias_init": "zeros"},
    {"type": "tanh"},
    {"type": "flatten"},
    {"type": "dense", "out_features": 6, "weight_init": "kaiming_uniform", "bias_init": "ones"},
    {"type": "dense", "out_features": 5, "weight_init": 0.25, "bias_init": -1.5},
    {"type": "dense", "out_features": 2, "weight_init": "zeros", "bias": false},
    {"type": "dense", "out_features": 3, "weight_init": "default", "bias_init": "default"}
  ])");
  const auto model = build_sequential(layers, {2, 5, 5}, 7);
  const auto params = model->named_parameters();
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias", "4.weight", "4.bias",
                                             "5.weight", "6.weight", "6.bias"}));
  const auto check_uniform = [](const Tensor& t, double bound, const std::string& what) {
    double largest = 0, sq = 0;
    for (float v : t.values()) {
      EXPECT_LE(std::abs(v), bound * (1 + 1e-6)) << what;
      largest = std::max(largest, std::abs(static_cast<double>(v)));
      sq += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(t.numel());
    EXPECT_GE(largest, bound * (1 - 10 / n)) << what;
    EXPECT_NEAR(std::sqrt(sq / n), bound / std::sqrt(3.0), bound / std::sqrt(3.0) * 5 * 0.447 / std::sqrt(n))
        << what;
  };
  // glorot (PyTorch's conv fans): fan_in = 2*3*3 = 18, fan_out = 4*3*3 = 36.
  check_uniform(params[0].tensor, std::sqrt(6.0 / (18 + 36)), "glorot conv");
  for (float v : params[1].tensor.values()) EXPECT_EQ(v, 0.0f);
  // kaiming_uniform: sqrt(6 / fan_in), fan_in = 4*3*3 = 36.
  check_uniform(params[2].tensor, std::sqrt(6.0 / 36), "kaiming dense");
  for (float v : params[3].tensor.values()) EXPECT_EQ(v, 1.0f);
  for (float v : params[4].tensor.values()) EXPECT_EQ(v, 0.25f);
  for (float v : params[5].tensor.values()) EXPECT_EQ(v, -1.5f);
  for (float v : params[6].tensor.values()) EXPECT_EQ(v, 0.0f);
  check_uniform(params[7].tensor, 1.0 / std::sqrt(2.0), "default dense (fan_in 2)");
  check_uniform(params[8].tensor, 1.0 / std::sqrt(2.0), "default bias (fan_in 2)");
}

TEST(BuildSequential, DropoutFollowsTrainingMode) {
  const Json layers = Json::parse(R"([{"type": "dropout", "p": 0.5}])");
  const auto model = build_sequential(layers, {1000}, 1);
  const Tensor x = Tensor::full({1, 1000}, 1.0f);
  NoGradGuard guard;
  const Tensor train_out = model->forward(x);
  int zeros = 0;
  for (float v : train_out.values()) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
    zeros += v == 0.0f;
  }
  EXPECT_NEAR(zeros, 500, 100);
  model->set_training(false);
  EXPECT_FALSE(model->layer(0).training());
  const Tensor eval_out = model->forward(x);
  for (float v : eval_out.values()) EXPECT_EQ(v, 1.0f);
}

// Masks are a function of the stream seed alone (what makes resumed runs replay dropout exactly),
// and two dropout layers draw independent masks from one stream seed.
TEST(BuildSequential, DropoutMasksFollowTheStreamSeed) {
  const auto model = build_sequential(
      Json::parse(R"([{"type": "dropout", "p": 0.5}, {"type": "dropout", "p": 0.5}])"), {256}, 1);
  const Tensor x = Tensor::full({1, 256}, 1.0f);
  NoGradGuard guard;
  const auto mask_of = [&](int layer, uint64_t stream) {
    model->reseed(stream);
    const auto v = model->layer(layer).forward(x).values();
    return std::vector<float>(v.begin(), v.end());
  };
  const auto a = mask_of(0, 7);
  model->layer(0).forward(x);  // advances the stream
  EXPECT_EQ(mask_of(0, 7), a);
  EXPECT_NE(mask_of(0, 8), a);
  EXPECT_NE(mask_of(1, 7), a);
}

TEST(BuildSequentialErrors, UnknownLayerType) {
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "convolution"}])"), {1, 28, 28}, 0);
      },
      {"model.layers[0].type", "convolution", "not a layer type"});
}

TEST(BuildSequentialErrors, UnknownKeyInALayer) {
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "conv2d", "out_channels": 4, "kernel": 3},
                                         {"type": "maxpool2d", "kernel": 2, "kernal": 2}])"),
                         {1, 28, 28}, 0);
      },
      {"model.layers[1].kernal", "not a known key", "did you mean model.layers[1].kernel?"});
  expect_error([] { build_sequential(Json::parse(R"([{"type": "relu", "inplace": true}])"), {4}, 0); },
               {"model.layers[0].inplace"});
}

TEST(BuildSequentialErrors, DenseWithoutFlatten) {
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "dense", "out_features": 10}])"), {1, 28, 28}, 0);
      },
      {"model.layers[0]", "flatten"});
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "conv2d", "out_channels": 2, "kernel": 3},
                                         {"type": "relu"}, {"type": "dense", "out_features": 10}])"),
                         {1, 8, 8}, 0);
      },
      {"model.layers[2]", "flatten"});
}

TEST(BuildSequentialErrors, MissingOutFeatures) {
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "flatten"}, {"type": "dense"}])"), {1, 4, 4}, 0);
      },
      {"model.layers[1].out_features", "missing"});
  // A misspelt required key is reported as the missing one, which names the misspelling.
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "flatten"}, {"type": "dense", "out_feature": 3}])"),
                         {1, 4, 4}, 0);
      },
      {"model.layers[1].out_features is missing (dense); model.layers[1].out_feature is given: a "
       "misspelling?"});
}

TEST(BuildSequentialErrors, BadValues) {
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "flatten"}, {"type": "dense", "out_features": "10"}])"),
                         {4}, 0);
      },
      {"model.layers[1].out_features", "expected an integer"});
  expect_error([] { build_sequential(Json::parse(R"([{"type": "dense", "out_features": 0}])"), {4}, 0); },
               {"model.layers[0].out_features", "out of range"});
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "conv2d", "out_channels": 2, "kernel": 30}])"), {1, 28, 28},
                         0);
      },
      {"model.layers[0]"});
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "dense", "out_features": 3, "weight_init": "xavier"}])"),
                         {4}, 0);
      },
      {"model.layers[0].weight_init", "xavier"});
  expect_error(
      [] {
        build_sequential(
            Json::parse(R"([{"type": "dense", "out_features": 3, "bias_init": "kaiming_uniform"}])"), {4}, 0);
      },
      {"model.layers[0].bias_init"});
  expect_error([] { build_sequential(Json::parse("[]"), {4}, 0); }, {"model.layers"});
  expect_error([] { build_sequential(Json::parse(R"({"type": "relu"})"), {4}, 0); }, {"model.layers"});
  expect_error([] { build_sequential(Json::parse(R"([{"kernel": 3}])"), {4}, 0); },
               {"model.layers[0].type", "missing"});
}

// ---- load_parameters ------------------------------------------------------------------------

TEST(LoadParameters, RoundTripThroughSafetensors) {
  const auto source = build_mnist(1), target = build_mnist(2);
  const std::string path = temp_path("weights.safetensors");
  safetensors::save(path, source->named_parameters(), {{"format", "test"}});
  load_parameters(*target, safetensors::load(path), path);
  std::filesystem::remove(path);
  const auto ps = source->named_parameters(), pt = target->named_parameters();
  for (std::size_t i = 0; i < ps.size(); ++i)
    EXPECT_TRUE(
        std::equal(ps[i].tensor.values().begin(), ps[i].tensor.values().end(), pt[i].tensor.values().begin()))
        << ps[i].name;
  // The loaded values are in the parameters themselves (the model computes with them).
  NoGradGuard guard;
  const Tensor x = Tensor::full({1, 1, 28, 28}, 0.25f);
  const Tensor ya = source->forward(x), yb = target->forward(x);
  for (int c = 0; c < 10; ++c) EXPECT_EQ(ya.data()[c], yb.data()[c]);
}

safetensors::File file_of(const Module& model) {
  safetensors::File file;
  for (const NamedTensor& p : model.named_parameters()) file.tensors.push_back({p.name, p.tensor.clone()});
  return file;
}

TEST(LoadParameters, MissingTensorIsNamed) {
  const auto model = build_mnist(1);
  safetensors::File file = file_of(*model);
  file.tensors.erase(file.tensors.begin() + 3);  // 3.bias
  expect_error([&] { load_parameters(*model, file, "ckpt.safetensors"); },
               {"ckpt.safetensors", "'3.bias'", "missing"});
}

TEST(LoadParameters, WrongShapeIsNamed) {
  const auto model = build_mnist(1);
  safetensors::File file = file_of(*model);
  file.tensors[4].tensor = Tensor::zeros({64, 1601});  // 7.weight
  expect_error([&] { load_parameters(*model, file, "ckpt.safetensors"); },
               {"ckpt.safetensors", "'7.weight'", "[64, 1601]", "[64, 1600]"});
  file = file_of(*model);
  file.tensors[0].tensor = Tensor::zeros({32, 1, 9});  // same element count, other shape
  expect_error([&] { load_parameters(*model, file, "ckpt.safetensors"); }, {"'0.weight'", "[32, 1, 9]"});
}

TEST(LoadParameters, ExtraTensorIsNamedUnlessIgnored) {
  const auto model = build_mnist(1);
  safetensors::File file = file_of(*model);
  file.tensors.push_back({"11.weight", Tensor::zeros({3})});
  expect_error([&] { load_parameters(*model, file, "ckpt.safetensors"); },
               {"ckpt.safetensors", "'11.weight'", "does not belong"});
  safetensors::File with_state = file_of(*model);
  with_state.tensors.push_back({"optimizer.0.weight.exp_avg", Tensor::zeros({32, 1, 3, 3})});
  EXPECT_NO_THROW(load_parameters(*model, with_state, "ckpt.safetensors", "optimizer."));
  expect_error([&] { load_parameters(*model, with_state, "ckpt.safetensors", "other."); },
               {"'optimizer.0.weight.exp_avg'"});
}

}  // namespace
}  // namespace dptrain::layers
