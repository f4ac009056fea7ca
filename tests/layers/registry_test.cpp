// The layer and architecture registries (every registered type builds, unknown names list the
// registered ones) and Container's walks over nested children (tensor order, training mode,
// SyncBatchNorm).
#include "layers/registry.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "layers/build.h"
#include "layers/module.h"
#include "tests/test_util.h"

namespace dptrain::layers {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

Tensor uniform(const Shape& shape, uint64_t seed) {
  return Tensor::from_data(shape, test_util::uniform_values(shape_numel(shape), seed));
}

TEST(LayerRegistry, HoldsEveryLayerType) {
  EXPECT_EQ(layer_type_names(),
            (std::vector<std::string>{"dense", "conv2d", "maxpool2d", "batchnorm2d", "global_avgpool",
                                      "basic_block", "bottleneck", "relu", "tanh", "sigmoid", "flatten",
                                      "dropout", "batchnorm1d"}));
}

TEST(LayerRegistry, UnknownTypeListsTheRegisteredOnes) {
  const std::string message = error_of([] {
    build_sequential(Json::parse(R"([{"type": "convolution"}])"), {1, 28, 28}, 0);
  });
  EXPECT_TRUE(
      message.starts_with("config key model.layers[0].type = \"convolution\" is not a layer type; use "))
      << message;
  for (const std::string& name : layer_type_names())
    EXPECT_NE(message.find("\"" + name + "\""), std::string::npos) << name << " missing from: " << message;
}

// A smallest spec and input of every registered type: a type added to the registry without one
// fails here, so each new layer builds, runs forward and backward, and agrees with its output_shape.
TEST(LayerRegistry, EveryRegisteredTypeBuildsAndRuns) {
  const std::map<std::string, std::pair<std::string, Shape>> specs = {
      {"dense", {R"({"type": "dense", "out_features": 3})", {5}}},
      {"conv2d", {R"({"type": "conv2d", "out_channels": 3, "kernel": 3})", {2, 5, 5}}},
      {"maxpool2d", {R"({"type": "maxpool2d", "kernel": 2})", {2, 4, 4}}},
      {"batchnorm2d", {R"({"type": "batchnorm2d"})", {2, 3, 3}}},
      {"global_avgpool", {R"({"type": "global_avgpool"})", {2, 3, 3}}},
      {"basic_block", {R"({"type": "basic_block", "planes": 4, "stride": 2})", {2, 4, 4}}},
      {"bottleneck", {R"({"type": "bottleneck", "planes": 2})", {3, 4, 4}}},
      {"relu", {R"({"type": "relu"})", {4}}},
      {"tanh", {R"({"type": "tanh"})", {4}}},
      {"sigmoid", {R"({"type": "sigmoid"})", {4}}},
      {"flatten", {R"({"type": "flatten"})", {2, 3, 3}}},
      {"dropout", {R"({"type": "dropout", "p": 0.25})", {8}}},
      {"batchnorm1d", {R"({"type": "batchnorm1d"})", {4}}},
  };
  for (const std::string& name : layer_type_names()) {
    ASSERT_TRUE(specs.count(name)) << "no spec for the registered layer type " << name;
    const auto& [spec, input] = specs.at(name);
    autograd::clear_tape();
    const auto model = build_sequential(Json::array({Json::parse(spec)}), input, 1);
    Shape batch{3};
    batch.insert(batch.end(), input.begin(), input.end());
    Tensor x = uniform(batch, 2);
    x.set_requires_grad(true);
    const Tensor y = model->forward(x);
    Shape expected{3};
    const Shape per_sample = model->output_shape(input);
    expected.insert(expected.end(), per_sample.begin(), per_sample.end());
    EXPECT_EQ(y.shape(), expected) << name;
    ops::sum(y).backward();
    EXPECT_TRUE(x.has_grad()) << name;
    EXPECT_FALSE(model->describe().empty()) << name;
  }
}

TEST(ArchitectureRegistry, HoldsTheResNetsAndListsThemForAnUnknownName) {
  EXPECT_EQ(architecture_names(), (std::vector<std::string>{"resnet18", "resnet34", "resnet50", "resnet20"}));
  const std::string message = error_of([] { build_architecture("resnet21", {3, 32, 32}, 10, 0); });
  EXPECT_TRUE(
      message.starts_with("config key model.architecture = \"resnet21\" is not an architecture; use "
                          "\"resnet18\", \"resnet34\", \"resnet50\" or \"resnet20\""))
      << message;
}

// A Container names its tensors in the order its children were added: torchvision's.
TEST(Container, ResidualBlockTensorsInTorchvisionOrder) {
  const ResidualBlock block(ResidualBlock::Kind::kBottleneck, "b", 4, 2, 2);
  std::vector<std::string> parameters, buffers;
  for (const NamedTensor& t : block.named_parameters()) parameters.push_back(t.name);
  for (const NamedTensor& t : block.named_buffers()) buffers.push_back(t.name);
  EXPECT_EQ(parameters, (std::vector<std::string>{
                            "b.conv1.weight", "b.bn1.weight", "b.bn1.bias", "b.conv2.weight", "b.bn2.weight",
                            "b.bn2.bias", "b.conv3.weight", "b.bn3.weight", "b.bn3.bias",
                            "b.downsample.0.weight", "b.downsample.1.weight", "b.downsample.1.bias"}));
  std::vector<std::string> expected_buffers;
  for (const char* bn : {"b.bn1", "b.bn2", "b.bn3", "b.downsample.1"})
    for (const char* buffer : {".running_mean", ".running_var", ".num_batches_tracked"})
      expected_buffers.push_back(std::string(bn) + buffer);
  EXPECT_EQ(buffers, expected_buffers);
}

class CountingSum : public CrossReplicaSum {
 public:
  void sum(double* /*values*/, int64_t /*n*/, Device /*device*/, const char* /*what*/) override { ++calls; }
  int calls = 0;
};

// Training mode and the SyncBatchNorm hook reach the BatchNorms inside a block inside a Sequential.
TEST(Container, ModeAndSyncReachNestedChildren) {
  const auto model = build_sequential(
      Json::parse(R"([{"type": "basic_block", "planes": 4, "stride": 2}, {"type": "global_avgpool"}])"),
      {2, 6, 6}, 3);
  const Tensor x = uniform({4, 2, 6, 6}, 5);
  NoGradGuard no_grad;
  const auto buffers_now = [&] {
    std::vector<std::vector<float>> out;
    for (const NamedTensor& b : model->named_buffers()) out.push_back(b.tensor.to_vector());
    return out;
  };
  model->set_training(false);
  const auto before = buffers_now();
  model->forward(x);
  EXPECT_EQ(buffers_now(), before) << "evaluation must not move any running statistic";
  model->set_training(true);
  model->forward(x);
  const auto after = buffers_now();
  for (std::size_t i = 0; i < after.size(); ++i)
    EXPECT_NE(after[i], before[i]) << model->named_buffers()[i].name << " did not move in training";

  CountingSum sync;
  model->sync_batch_statistics(&sync);
  model->forward(x);
  const int per_forward = sync.calls;
  EXPECT_GT(per_forward, 0);
  // Three BatchNorms (bn1, bn2, downsample.1), each summing the same statistics.
  EXPECT_EQ(per_forward % 3, 0) << per_forward;
  model->sync_batch_statistics(nullptr);
  model->forward(x);
  EXPECT_EQ(sync.calls, per_forward);
}

}  // namespace
}  // namespace dptrain::layers
