// ResidualBlock and its layer types "basic_block" and "bottleneck".
#include "layers/residual.h"

#include "core/error.h"
#include "layers/init.h"
#include "layers/registry.h"

namespace dptrain::layers {

ResidualBlock::ResidualBlock(Kind kind, const std::string& name, int64_t in_channels, int64_t planes,
                             int stride)
    : kind_(kind),
      in_channels_(in_channels),
      out_channels_(kind == Kind::kBasic ? planes : 4 * planes),
      stride_(stride) {
  const std::string p = name + ".";
  if (kind == Kind::kBasic) {
    path_.push_back(add_conv_bn(p + "conv1", p + "bn1", in_channels, planes, 3, stride));
    path_.push_back(add_conv_bn(p + "conv2", p + "bn2", planes, planes, 3, 1));
  } else {
    path_.push_back(add_conv_bn(p + "conv1", p + "bn1", in_channels, planes, 1, 1));
    path_.push_back(add_conv_bn(p + "conv2", p + "bn2", planes, planes, 3, stride));
    path_.push_back(add_conv_bn(p + "conv3", p + "bn3", planes, out_channels_, 1, 1));
  }
  if (stride != 1 || in_channels != out_channels_)
    downsample_ = add_conv_bn(p + "downsample.0", p + "downsample.1", in_channels, out_channels_, 1, stride);
}

ResidualBlock::ConvBn ResidualBlock::add_conv_bn(const std::string& conv_name, const std::string& bn_name,
                                                 int64_t in, int64_t out, int kernel, int stride) {
  Conv2D& conv = add_child(std::make_unique<Conv2D>(conv_name, in, out, kernel, stride, kernel / 2, false));
  BatchNorm2d& bn = add_child(std::make_unique<BatchNorm2d>(bn_name, out));
  return {&conv, &bn};
}

// relu(path(x) + shortcut(x)), each BatchNorm applying what follows it in its own pass: the ReLU
// inside the path, and the shortcut's addition and the final ReLU after the last one.
Tensor ResidualBlock::forward(const Tensor& x) {
  Tensor h = x;
  for (std::size_t i = 0; i + 1 < path_.size(); ++i)
    h = path_[i].bn->forward(path_[i].conv->forward(h), {}, true);
  const Tensor shortcut = downsample_ ? downsample_->bn->forward(downsample_->conv->forward(x)) : x;
  return path_.back().bn->forward(path_.back().conv->forward(h), shortcut, true);
}

Shape ResidualBlock::output_shape(const Shape& input) const {
  Shape s = input;
  for (const ConvBn& p : path_) s = p.bn->output_shape(p.conv->output_shape(s));
  return s;
}

int64_t ResidualBlock::multiply_adds(const Shape& input) const {
  int64_t total = downsample_ ? downsample_->conv->multiply_adds(input) : 0;
  Shape s = input;
  for (const ConvBn& p : path_) {
    total += p.conv->multiply_adds(s);
    s = p.conv->output_shape(s);
  }
  return total;
}

std::string ResidualBlock::describe() const {
  return std::string(kind_ == Kind::kBasic ? "BasicBlock(" : "Bottleneck(") + std::to_string(in_channels_) +
         " -> " + std::to_string(out_channels_) + ", stride " + std::to_string(stride_) +
         (downsample_ ? ", downsample" : "") + ")";
}

std::vector<const Conv2D*> ResidualBlock::convolutions() const {
  std::vector<const Conv2D*> out;
  for (const ConvBn& p : path_) out.push_back(p.conv);
  if (downsample_) out.push_back(downsample_->conv);
  return out;
}

std::unique_ptr<ResidualBlock> residual_block(ResidualBlock::Kind kind, const std::string& name,
                                              int64_t in_channels, int64_t planes, int stride,
                                              uint64_t seed) {
  auto block = std::make_unique<ResidualBlock>(kind, name, in_channels, planes, stride);
  for (const Conv2D* conv : block->convolutions()) {
    const NamedTensor weight = conv->named_parameters().front();
    kaiming_normal_fan_out(weight.tensor, seed, weight.name);
  }
  return block;
}

namespace {
template <ResidualBlock::Kind kind>
std::unique_ptr<Module> build_residual_block(const LayerContext& c) {
  ObjectReader& r = c.config;
  const std::string type = kind == ResidualBlock::Kind::kBasic ? "basic_block" : "bottleneck";
  DPTRAIN_CHECK(c.input.size() == 3, "config key ", r.path_of("type"), ": ", type,
                " needs a [C, H, W] input, gets ", shape_str(c.input));
  DPTRAIN_CHECK(r.has("planes"), r.missing("planes", " (" + type + ")"));
  const int64_t planes = r.get_in_range<int64_t>("planes", 1, 1, 1 << 16);
  const int stride = r.get_in_range("stride", 1, 1, 8);
  return residual_block(kind, c.name, c.input[0], planes, stride, c.seed);
}
}  // namespace

extern const LayerType kBasicBlockLayer{"basic_block", build_residual_block<ResidualBlock::Kind::kBasic>};
extern const LayerType kBottleneckLayer{"bottleneck", build_residual_block<ResidualBlock::Kind::kBottleneck>};

}  // namespace dptrain::layers
