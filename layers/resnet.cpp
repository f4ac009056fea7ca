// The ResNet architectures "resnet18", "resnet34", "resnet50" (torchvision's layout and
// initialisation; conv1 takes input_shape[0] channels) and "resnet20" (He et al. 2016, section 4.2,
// with 1x1-conv shortcuts). Tensor names equal torchvision's state_dict keys.
#include "core/error.h"
#include "layers/init.h"
#include "layers/module.h"
#include "layers/registry.h"

namespace dptrain::layers {
namespace {

// torchvision's ResNet layout: a stem, stages of residual blocks (the first block of a stage with the
// stage's stride), global average pooling and "fc".
struct ResNetLayout {
  ResidualBlock::Kind block;
  std::vector<int> blocks_per_stage;
  std::vector<int64_t> planes;
  bool imagenet_stem;  // 7x7 stride-2 conv + 3x3 stride-2 max-pool; else a 3x3 stride-1 conv
};

std::unique_ptr<Sequential> build_resnet(const std::string& architecture, const ResNetLayout& layout,
                                         const Shape& input_shape, int64_t num_classes, uint64_t seed) {
  DPTRAIN_CHECK(input_shape.size() == 3, "config key model.input_shape = ", shape_str(input_shape), ": ",
                architecture, " needs [C, H, W]");
  auto model = std::make_unique<Sequential>();
  const int64_t stem_channels = layout.planes.front();
  auto conv1 = layout.imagenet_stem
                   ? std::make_unique<Conv2D>("conv1", input_shape[0], stem_channels, 7, 2, 3, false)
                   : std::make_unique<Conv2D>("conv1", input_shape[0], stem_channels, 3, 1, 1, false);
  kaiming_normal_fan_out(conv1->weight(), seed, "conv1.weight");
  model->add(std::move(conv1));
  model->add(std::make_unique<BatchNorm2d>("bn1", stem_channels));
  model->add(std::make_unique<ActivationLayer>(Activation::kRelu));
  if (layout.imagenet_stem) model->add(std::make_unique<MaxPool2D>(3, 2, 1));
  int64_t channels = stem_channels;
  for (std::size_t stage = 0; stage < layout.planes.size(); ++stage)
    for (int b = 0; b < layout.blocks_per_stage[stage]; ++b) {
      const int stride = stage > 0 && b == 0 ? 2 : 1;
      const std::string name = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      auto block = residual_block(layout.block, name, channels, layout.planes[stage], stride, seed);
      channels = block->out_channels();
      model->add(std::move(block));
    }
  model->add(std::make_unique<GlobalAvgPool>());
  auto fc = std::make_unique<Dense>("fc", channels, num_classes, true);
  const Initializer default_init{};
  initialize(fc->weight(), default_init, channels, num_classes, seed, "fc.weight");
  initialize(fc->bias(), default_init, channels, num_classes, seed, "fc.bias");
  model->add(std::move(fc));
  return model;
}

using Kind = ResidualBlock::Kind;

std::unique_ptr<Sequential> resnet18(const Shape& input_shape, int64_t num_classes, uint64_t seed) {
  return build_resnet("resnet18", {Kind::kBasic, {2, 2, 2, 2}, {64, 128, 256, 512}, true}, input_shape,
                      num_classes, seed);
}

std::unique_ptr<Sequential> resnet34(const Shape& input_shape, int64_t num_classes, uint64_t seed) {
  return build_resnet("resnet34", {Kind::kBasic, {3, 4, 6, 3}, {64, 128, 256, 512}, true}, input_shape,
                      num_classes, seed);
}

std::unique_ptr<Sequential> resnet50(const Shape& input_shape, int64_t num_classes, uint64_t seed) {
  return build_resnet("resnet50", {Kind::kBottleneck, {3, 4, 6, 3}, {64, 128, 256, 512}, true}, input_shape,
                      num_classes, seed);
}

std::unique_ptr<Sequential> resnet20(const Shape& input_shape, int64_t num_classes, uint64_t seed) {
  return build_resnet("resnet20", {Kind::kBasic, {3, 3, 3}, {16, 32, 64}, false}, input_shape, num_classes,
                      seed);
}

}  // namespace

extern const Architecture kResnet18{"resnet18", resnet18};
extern const Architecture kResnet34{"resnet34", resnet34};
extern const Architecture kResnet50{"resnet50", resnet50};
extern const Architecture kResnet20{"resnet20", resnet20};

}  // namespace dptrain::layers
