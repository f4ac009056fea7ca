// Module and the layers: Dense, Conv2D, MaxPool2D, ReLU, Tanh, Sigmoid, Flatten, Dropout, Sequential.
// Parameters are named "{i}.weight" / "{i}.bias" (i = the layer's index in model.layers) with
// PyTorch layouts, so weights exchange with an equivalent torch.nn.Sequential by name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace dptrain::layers {

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  // Per-sample output shape for a per-sample input shape; throws when the input does not fit.
  virtual Shape output_shape(const Shape& input) const = 0;
  virtual std::vector<NamedTensor> named_parameters() const { return {}; }
  virtual std::string describe() const = 0;
  virtual void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }
  // Restarts every random stream (dropout masks) from `stream_seed`. The trainer derives it from
  // (seed, rank, step, pass), so masks follow from the position alone and a checkpoint needs to
  // carry no generator state.
  virtual void reseed(uint64_t /*stream_seed*/) {}

 private:
  bool training_ = true;
};

class Dense : public Module {
 public:
  Dense(int index, int64_t in_features, int64_t out_features, bool bias);
  Tensor forward(const Tensor& x) override { return ops::linear(x, weight_, bias_); }
  Shape output_shape(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int index_;
  Tensor weight_, bias_;  // [out, in], [out] (bias undefined when disabled)
};

class Conv2D : public Module {
 public:
  Conv2D(int index, int64_t in_channels, int64_t out_channels, int kernel, int stride, int padding,
         bool bias);
  Tensor forward(const Tensor& x) override {
    return ops::conv2d(x, weight_, bias_, {stride_, padding_, fuse_relu_});
  }
  // Applies the following ReLU inside the convolution (see Conv2dOptions::fuse_relu).
  void fuse_relu() { fuse_relu_ = true; }
  Shape output_shape(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int index_;
  int kernel_, stride_, padding_;
  bool fuse_relu_ = false;
  Tensor weight_, bias_;  // [out_c, in_c, k, k], [out_c]
};

class MaxPool2D : public Module {
 public:
  MaxPool2D(int kernel, int stride) : kernel_(kernel), stride_(stride) {}
  Tensor forward(const Tensor& x) override { return ops::maxpool2d(x, kernel_, stride_); }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;

 private:
  int kernel_, stride_;
};

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

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::flatten(x); }
  Shape output_shape(const Shape& input) const override { return {shape_numel(input)}; }
  std::string describe() const override { return "Flatten"; }
};

class Dropout : public Module {
 public:
  Dropout(int index, float p) : p_(p), stream_name_("dropout." + std::to_string(index)) { reseed(0); }
  Tensor forward(const Tensor& x) override { return training() && p_ > 0.0f ? ops::dropout(x, p_, rng_) : x; }
  Shape output_shape(const Shape& input) const override { return input; }
  std::string describe() const override;
  void reseed(uint64_t stream_seed) override { rng_ = Rng(derive_seed(stream_seed, stream_name_)); }

 private:
  float p_;
  std::string stream_name_;  // keeps two dropout layers' masks independent
  Rng rng_;
};

class Sequential : public Module {
 public:
  void add(std::unique_ptr<Module> layer) { layers_.push_back(std::move(layer)); }
  Tensor forward(const Tensor& x) override;
  Shape output_shape(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::string describe() const override;
  void set_training(bool on) override;
  void reseed(uint64_t stream_seed) override;

  std::size_t size() const { return layers_.size(); }
  Module& layer(std::size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::unique_ptr<Module>> layers_;
};

int64_t parameter_count(const Module& module);

}  // namespace dptrain::layers
