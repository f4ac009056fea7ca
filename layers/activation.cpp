// ActivationLayer and Dropout, and their layer types "relu", "tanh", "sigmoid" and "dropout".
#include "layers/activation.h"

#include "layers/registry.h"

namespace dptrain::layers {

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

namespace {
template <Activation kind>
std::unique_ptr<Module> build_activation(const LayerContext& /*context*/) {
  return std::make_unique<ActivationLayer>(kind);
}

std::unique_ptr<Module> build_dropout(const LayerContext& c) {
  return std::make_unique<Dropout>(c.name, c.config.get_in_range("p", 0.5f, 0.0f, 0.99f));
}
}  // namespace

extern const LayerType kReluLayer{"relu", build_activation<Activation::kRelu>};
extern const LayerType kTanhLayer{"tanh", build_activation<Activation::kTanh>};
extern const LayerType kSigmoidLayer{"sigmoid", build_activation<Activation::kSigmoid>};
extern const LayerType kDropoutLayer{"dropout", build_dropout};

}  // namespace dptrain::layers
