// Layer implementations.
#include "layers/module.h"

#include "core/error.h"

namespace dptrain::layers {
namespace {
// "{i}.weight" and, when present, "{i}.bias": the names PyTorch gives the same layer in a Sequential.
std::vector<NamedTensor> weight_and_bias(int index, const Tensor& weight, const Tensor& bias) {
  const std::string prefix = std::to_string(index) + ".";
  std::vector<NamedTensor> out{{prefix + "weight", weight}};
  if (bias.defined()) out.push_back({prefix + "bias", bias});
  return out;
}
}  // namespace

Dense::Dense(int index, int64_t in_features, int64_t out_features, bool bias)
    : index_(index), weight_(Tensor::zeros({out_features, in_features}, true)) {
  if (bias) bias_ = Tensor::zeros({out_features}, true);
}

Shape Dense::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 1 && input[0] == weight_.dim(1), "layer ", index_, " (dense): expects ",
                weight_.dim(1), " input features, gets per-sample shape ", shape_str(input),
                input.size() > 1 ? "; add a {\"type\": \"flatten\"} layer before it" : "");
  return {weight_.dim(0)};
}

std::vector<NamedTensor> Dense::named_parameters() const {
  return weight_and_bias(index_, weight_, bias_);
}

std::string Dense::describe() const {
  return "Dense(" + std::to_string(weight_.dim(1)) + " -> " + std::to_string(weight_.dim(0)) +
         (bias_.defined() ? "" : ", no bias") + ")";
}

Conv2D::Conv2D(int index, int64_t in_channels, int64_t out_channels, int kernel, int stride, int padding,
               bool bias)
    : index_(index),
      kernel_(kernel),
      stride_(stride),
      padding_(padding),
      weight_(Tensor::zeros({out_channels, in_channels, kernel, kernel}, true)) {
  if (bias) bias_ = Tensor::zeros({out_channels}, true);
}

Shape Conv2D::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3 && input[0] == weight_.dim(1), "layer ", index_, " (conv2d): expects [",
                weight_.dim(1), ", H, W] per sample, gets ", shape_str(input));
  const int64_t h = (input[1] + 2 * padding_ - kernel_) / stride_ + 1;
  const int64_t w = (input[2] + 2 * padding_ - kernel_) / stride_ + 1;
  DPTRAIN_CHECK(h > 0 && w > 0, "layer ", index_, " (conv2d): kernel ", kernel_, " does not fit input ",
                shape_str(input));
  return {weight_.dim(0), h, w};
}

std::vector<NamedTensor> Conv2D::named_parameters() const {
  return weight_and_bias(index_, weight_, bias_);
}

std::string Conv2D::describe() const {
  return "Conv2D(" + std::to_string(weight_.dim(1)) + " -> " + std::to_string(weight_.dim(0)) + ", " +
         std::to_string(kernel_) + "x" + std::to_string(kernel_) + ", stride " + std::to_string(stride_) +
         ", padding " + std::to_string(padding_) + ")";
}

Shape MaxPool2D::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3 && input[1] >= kernel_ && input[2] >= kernel_, "maxpool2d: kernel ",
                kernel_, " does not fit per-sample input ", shape_str(input));
  return {input[0], (input[1] - kernel_) / stride_ + 1, (input[2] - kernel_) / stride_ + 1};
}

std::string MaxPool2D::describe() const {
  return "MaxPool2D(" + std::to_string(kernel_) + ", stride " + std::to_string(stride_) + ")";
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

std::vector<NamedTensor> Sequential::named_parameters() const {
  std::vector<NamedTensor> out;
  for (const auto& layer : layers_)
    for (NamedTensor& p : layer->named_parameters()) out.push_back(std::move(p));
  return out;
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

}  // namespace dptrain::layers
