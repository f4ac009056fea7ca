// Layer implementations.
#include "layers/module.h"

#include "core/backend.h"
#include "core/error.h"

namespace dptrain::layers {
namespace {
// "<name>.weight" and, when present, "<name>.bias".
std::vector<NamedTensor> weight_and_bias(const std::string& name, const Tensor& weight, const Tensor& bias) {
  const std::string prefix = name + ".";
  std::vector<NamedTensor> out{{prefix + "weight", weight}};
  if (bias.defined()) out.push_back({prefix + "bias", bias});
  return out;
}
}  // namespace

Dense::Dense(std::string name, int64_t in_features, int64_t out_features, bool bias)
    : name_(std::move(name)), weight_(Tensor::zeros({out_features, in_features}, true)) {
  if (bias) bias_ = Tensor::zeros({out_features}, true);
}

Shape Dense::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 1 && input[0] == weight_.dim(1), "layer ", name_, " (dense): expects ",
                weight_.dim(1), " input features, gets per-sample shape ", shape_str(input),
                input.size() > 1 ? "; add a {\"type\": \"flatten\"} layer before it" : "");
  return {weight_.dim(0)};
}

std::vector<NamedTensor> Dense::named_parameters() const {
  return weight_and_bias(name_, weight_, bias_);
}

std::string Dense::describe() const {
  return "Dense(" + std::to_string(weight_.dim(1)) + " -> " + std::to_string(weight_.dim(0)) +
         (bias_.defined() ? "" : ", no bias") + ")";
}

Conv2D::Conv2D(std::string name, int64_t in_channels, int64_t out_channels, int kernel, int stride,
               int padding, bool bias)
    : name_(std::move(name)),
      kernel_(kernel),
      stride_(stride),
      padding_(padding),
      weight_(Tensor::zeros({out_channels, in_channels, kernel, kernel}, true)) {
  if (bias) bias_ = Tensor::zeros({out_channels}, true);
}

Shape Conv2D::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3 && input[0] == weight_.dim(1), "layer ", name_, " (conv2d): expects [",
                weight_.dim(1), ", H, W] per sample, gets ", shape_str(input));
  const int64_t h = (input[1] + 2 * padding_ - kernel_) / stride_ + 1;
  const int64_t w = (input[2] + 2 * padding_ - kernel_) / stride_ + 1;
  DPTRAIN_CHECK(h > 0 && w > 0, "layer ", name_, " (conv2d): kernel ", kernel_, " does not fit input ",
                shape_str(input));
  return {weight_.dim(0), h, w};
}

int64_t Conv2D::multiply_adds(const Shape& input) const {
  return shape_numel(output_shape(input)) * (weight_.numel() / weight_.dim(0));
}

std::vector<NamedTensor> Conv2D::named_parameters() const {
  return weight_and_bias(name_, weight_, bias_);
}

std::string Conv2D::describe() const {
  return "Conv2D(" + std::to_string(weight_.dim(1)) + " -> " + std::to_string(weight_.dim(0)) + ", " +
         std::to_string(kernel_) + "x" + std::to_string(kernel_) + ", stride " + std::to_string(stride_) +
         ", padding " + std::to_string(padding_) + ")";
}

Shape MaxPool2D::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(2 * padding_ <= kernel_, "maxpool2d: padding ", padding_, " must be at most half the kernel ",
                kernel_);
  DPTRAIN_CHECK(input.size() == 3 && input[1] + 2 * padding_ >= kernel_ && input[2] + 2 * padding_ >= kernel_,
                "maxpool2d: kernel ", kernel_, " does not fit per-sample input ", shape_str(input));
  return {input[0], (input[1] + 2 * padding_ - kernel_) / stride_ + 1,
          (input[2] + 2 * padding_ - kernel_) / stride_ + 1};
}

std::string MaxPool2D::describe() const {
  return "MaxPool2D(" + std::to_string(kernel_) + ", stride " + std::to_string(stride_) +
         (padding_ ? ", padding " + std::to_string(padding_) : "") + ")" +
         (fused_ ? " (fused into the convolution before)" : "");
}

BatchNorm2d::BatchNorm2d(std::string name, int64_t channels)
    : name_(std::move(name)),
      weight_(Tensor::full({channels}, 1.0f, true)),
      bias_(Tensor::zeros({channels}, true)),
      running_mean_(Tensor::zeros({channels})),
      running_var_(Tensor::full({channels}, 1.0f)),
      num_batches_tracked_(Tensor::zeros({})) {}

Tensor BatchNorm2d::forward(const Tensor& x) {
  if (training())
    backend_for(num_batches_tracked_.device()).add_scalar(num_batches_tracked_.data_ptr(), 1, 1.0f);
  return ops::batch_norm(x, weight_, bias_, running_mean_, running_var_,
                         {.training = training(), .momentum = 0.1f, .eps = 1e-5f, .sync = sync_});
}

Shape BatchNorm2d::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3 && input[0] == weight_.dim(0), "layer ", name_, " (batchnorm2d): expects [",
                weight_.dim(0), ", H, W] per sample, gets ", shape_str(input));
  return input;
}

std::vector<NamedTensor> BatchNorm2d::named_parameters() const {
  return weight_and_bias(name_, weight_, bias_);
}

std::vector<NamedTensor> BatchNorm2d::named_buffers() const {
  return {{name_ + ".running_mean", running_mean_},
          {name_ + ".running_var", running_var_},
          {name_ + ".num_batches_tracked", num_batches_tracked_, StoredType::kI64}};
}

std::string BatchNorm2d::describe() const {
  return "BatchNorm2d(" + std::to_string(weight_.dim(0)) + (sync_ ? ", synchronised across ranks" : "") + ")";
}

Shape GlobalAvgPool::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3, "global_avgpool: expects [C, H, W] per sample, gets ", shape_str(input));
  return {input[0]};
}

ResidualBlock::ResidualBlock(Kind kind, const std::string& name, int64_t in_channels, int64_t planes,
                             int stride)
    : kind_(kind),
      in_channels_(in_channels),
      out_channels_(kind == Kind::kBasic ? planes : 4 * planes),
      stride_(stride) {
  const auto conv_bn = [&](int i, int64_t in, int64_t out, int kernel, int conv_stride) {
    const std::string n = std::to_string(i);
    return ConvBn{
        std::make_unique<Conv2D>(name + ".conv" + n, in, out, kernel, conv_stride, kernel / 2, false),
        std::make_unique<BatchNorm2d>(name + ".bn" + n, out)};
  };
  if (kind == Kind::kBasic) {
    path_.push_back(conv_bn(1, in_channels, planes, 3, stride));
    path_.push_back(conv_bn(2, planes, planes, 3, 1));
  } else {
    path_.push_back(conv_bn(1, in_channels, planes, 1, 1));
    path_.push_back(conv_bn(2, planes, planes, 3, stride));
    path_.push_back(conv_bn(3, planes, out_channels_, 1, 1));
  }
  if (stride != 1 || in_channels != out_channels_) {
    downsample_ = ConvBn{
        std::make_unique<Conv2D>(name + ".downsample.0", in_channels, out_channels_, 1, stride, 0, false),
        std::make_unique<BatchNorm2d>(name + ".downsample.1", out_channels_)};
  }
}

Tensor ResidualBlock::forward(const Tensor& x) {
  Tensor h = x;
  for (std::size_t i = 0; i < path_.size(); ++i) {
    h = path_[i].bn->forward(path_[i].conv->forward(h));
    if (i + 1 < path_.size()) h = ops::relu(h);
  }
  const Tensor shortcut = downsample_ ? downsample_->bn->forward(downsample_->conv->forward(x)) : x;
  return ops::relu(ops::add(h, shortcut));
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

std::vector<NamedTensor> ResidualBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  const auto add = [&](const ConvBn& p) {
    for (auto* m : std::initializer_list<const Module*>{p.conv.get(), p.bn.get()})
      for (NamedTensor& t : m->named_parameters()) out.push_back(std::move(t));
  };
  for (const ConvBn& p : path_) add(p);
  if (downsample_) add(*downsample_);
  return out;
}

std::vector<NamedTensor> ResidualBlock::named_buffers() const {
  std::vector<NamedTensor> out;
  for (const ConvBn& p : path_)
    for (NamedTensor& t : p.bn->named_buffers()) out.push_back(std::move(t));
  if (downsample_)
    for (NamedTensor& t : downsample_->bn->named_buffers()) out.push_back(std::move(t));
  return out;
}

std::string ResidualBlock::describe() const {
  return std::string(kind_ == Kind::kBasic ? "BasicBlock(" : "Bottleneck(") + std::to_string(in_channels_) +
         " -> " + std::to_string(out_channels_) + ", stride " + std::to_string(stride_) +
         (downsample_ ? ", downsample" : "") + ")";
}

void ResidualBlock::set_training(bool on) {
  Module::set_training(on);
  for (ConvBn& p : path_) p.bn->set_training(on);
  if (downsample_) downsample_->bn->set_training(on);
}

void ResidualBlock::sync_batch_statistics(CrossReplicaSum* sync) {
  for (ConvBn& p : path_) p.bn->sync_batch_statistics(sync);
  if (downsample_) downsample_->bn->sync_batch_statistics(sync);
}

std::vector<const Conv2D*> ResidualBlock::convolutions() const {
  std::vector<const Conv2D*> out;
  for (const ConvBn& p : path_) out.push_back(p.conv.get());
  if (downsample_) out.push_back(downsample_->conv.get());
  return out;
}

Tensor ActivationLayer::forward(const Tensor& x) {
  return fused_ ? x : ops::activation(x, kind_);
}

std::string ActivationLayer::describe() const {
  switch (kind_) {
    case Activation::kRelu:
      return fused_ ? "ReLU (fused into the layer before)" : "ReLU";
    case Activation::kTanh:
      return "Tanh";
    case Activation::kSigmoid:
      return "Sigmoid";
  }
  return "?";
}

std::string Dropout::describe() const {
  return "Dropout(p=" + std::to_string(p_) + ")";
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = layer->forward(h);
  return h;
}

Shape Sequential::output_shape(const Shape& input) const {
  Shape s = input;
  for (const auto& layer : layers_) s = layer->output_shape(s);
  return s;
}

int64_t Sequential::multiply_adds(const Shape& input) const {
  int64_t total = 0;
  Shape s = input;
  for (const auto& layer : layers_) {
    total += layer->multiply_adds(s);
    s = layer->output_shape(s);
  }
  return total;
}

std::vector<NamedTensor> Sequential::named_parameters() const {
  std::vector<NamedTensor> out;
  for (const auto& layer : layers_)
    for (NamedTensor& p : layer->named_parameters()) out.push_back(std::move(p));
  return out;
}

std::vector<NamedTensor> Sequential::named_buffers() const {
  std::vector<NamedTensor> out;
  for (const auto& layer : layers_)
    for (NamedTensor& p : layer->named_buffers()) out.push_back(std::move(p));
  return out;
}

void Sequential::sync_batch_statistics(CrossReplicaSum* sync) {
  for (auto& layer : layers_) layer->sync_batch_statistics(sync);
}

std::string Sequential::describe() const {
  std::string s;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    s += "  " + std::to_string(i) + ": " + layers_[i]->describe() + "\n";
  return s;
}

void Sequential::set_training(bool on) {
  Module::set_training(on);
  for (auto& layer : layers_) layer->set_training(on);
}

void Sequential::reseed(uint64_t stream_seed) {
  for (auto& layer : layers_) layer->reseed(stream_seed);
}

int64_t parameter_count(const Module& module) {
  int64_t n = 0;
  for (const NamedTensor& p : module.named_parameters()) n += p.tensor.numel();
  return n;
}

std::vector<NamedTensor> state_tensors(const Module& module) {
  std::vector<NamedTensor> out = module.named_parameters();
  for (NamedTensor& b : module.named_buffers()) out.push_back(std::move(b));
  return out;
}

}  // namespace dptrain::layers
