// ActivationLayer (ReLU, Tanh, Sigmoid) and Dropout: elementwise layers without parameters.
#pragma once

#include <string>

#include "core/rng.h"
#include "layers/module_base.h"

namespace dptrain::layers {

using dptrain::Activation;

class ActivationLayer : public Module {
 public:
  explicit ActivationLayer(Activation kind) : kind_(kind) {}
  Tensor forward(const Tensor& x) override;
  Shape output_shape(const Shape& input) const override { return input; }
  std::string describe() const override;
  Activation kind() const { return kind_; }
  // The layer before applies this activation itself; forward passes its input through.
  void mark_fused() { fused_ = true; }

 private:
  Activation kind_;
  bool fused_ = false;
};

class Dropout : public Module {
 public:
  Dropout(const std::string& name, float p) : p_(p), stream_name_("dropout." + name) { reseed(0); }
  Tensor forward(const Tensor& x) override { return training() && p_ > 0.0f ? ops::dropout(x, p_, rng_) : x; }
  Shape output_shape(const Shape& input) const override { return input; }
  std::string describe() const override;
  void reseed(uint64_t stream_seed) override { rng_ = Rng(derive_seed(stream_seed, stream_name_)); }

 private:
  float p_;
  std::string stream_name_;  // keeps two dropout layers' masks independent
  Rng rng_;
};

}  // namespace dptrain::layers
