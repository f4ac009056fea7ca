// torchvision's residual blocks, BasicBlock and Bottleneck, as one Container.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/batchnorm.h"
#include "layers/conv.h"
#include "layers/module_base.h"

namespace dptrain::layers {

// out = relu(path(x) + shortcut(x)), where path is conv-BN pairs with ReLU between them and shortcut
// is x itself, or "downsample" (a 1x1 convolution with the block's stride and a BN) when the stride
// or the channel count changes.
//   BasicBlock: 3x3 (stride) - 3x3, out channels = planes
//   Bottleneck: 1x1 - 3x3 (stride, as torchvision's v1.5) - 1x1, out channels = 4 planes
// Convolutions have no bias (the BN after each has one). Tensor names as torchvision's:
// "<name>.conv1.weight", "<name>.bn1.running_var", "<name>.downsample.0.weight", ...
class ResidualBlock : public Container {
 public:
  enum class Kind { kBasic, kBottleneck };
  ResidualBlock(Kind kind, const std::string& name, int64_t in_channels, int64_t planes, int stride);
  Tensor forward(const Tensor& x) override;
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& input) const override;
  std::string describe() const override;
  // Every convolution's weight, for initialisation.
  std::vector<const Conv2D*> convolutions() const;
  int64_t out_channels() const { return out_channels_; }

 private:
  // Children of this block, added conv then BN: torchvision's order of their tensors.
  struct ConvBn {
    Conv2D* conv;
    BatchNorm2d* bn;
  };
  ConvBn add_conv_bn(const std::string& conv_name, const std::string& bn_name, int64_t in, int64_t out,
                     int kernel, int stride);

  Kind kind_;
  int64_t in_channels_, out_channels_;
  int stride_;
  std::vector<ConvBn> path_;
  std::optional<ConvBn> downsample_;
};

// A block whose convolutions have torchvision's initialisation (init.h: kaiming_normal_fan_out), each
// from its own stream of `seed`.
std::unique_ptr<ResidualBlock> residual_block(ResidualBlock::Kind kind, const std::string& name,
                                              int64_t in_channels, int64_t planes, int stride, uint64_t seed);

}  // namespace dptrain::layers
