// Module and the layers: Dense, Conv2D, MaxPool2D, BatchNorm2d, GlobalAvgPool, ReLU, Tanh, Sigmoid,
// Flatten, Dropout, the residual blocks (BasicBlock, Bottleneck) and Sequential. Every layer is built
// with the name PyTorch gives it ("3" in a Sequential, "layer2.0.conv1" in a torchvision ResNet) and
// names its tensors "<name>.weight", "<name>.running_mean", ... with PyTorch's layouts, so weights
// and buffers exchange with the equivalent PyTorch model by name.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace dptrain::layers {

using ops::CrossReplicaSum;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  // Per-sample output shape for a per-sample input shape; throws when the input does not fit.
  virtual Shape output_shape(const Shape& input) const = 0;
  virtual std::vector<NamedTensor> named_parameters() const { return {}; }
  // State that is not trained: BatchNorm's running statistics and its batch counter.
  virtual std::vector<NamedTensor> named_buffers() const { return {}; }
  virtual std::string describe() const = 0;
  // Multiply-adds of forward per sample for a per-sample input shape, counting the GEMM-shaped layers
  // (convolutions, dense) only: the rest move memory rather than compute. Training costs about
  // three times this (forward, and backward's input and weight gradients) in multiply-adds.
  virtual int64_t multiply_adds(const Shape& /*input*/) const { return 0; }
  // SyncBatchNorm: batch statistics summed over the replicas through `sync` (null: this rank's batch).
  virtual void sync_batch_statistics(CrossReplicaSum* /*sync*/) {}
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
  Dense(std::string name, int64_t in_features, int64_t out_features, bool bias);
  Tensor forward(const Tensor& x) override { return ops::linear(x, weight_, bias_); }
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& /*input*/) const override { return weight_.numel(); }
  std::vector<NamedTensor> named_parameters() const override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::string name_;
  Tensor weight_, bias_;  // [out, in], [out] (bias undefined when disabled)
};

class Conv2D : public Module {
 public:
  Conv2D(std::string name, int64_t in_channels, int64_t out_channels, int kernel, int stride, int padding,
         bool bias);
  Tensor forward(const Tensor& x) override {
    if (fused_pool_)
      return ops::conv2d_relu_maxpool(x, weight_, bias_, {stride_, padding_, true}, *fused_pool_);
    return ops::conv2d(x, weight_, bias_, {stride_, padding_, fuse_relu_});
  }
  // Applies the following ReLU inside the convolution (see Conv2dOptions::fuse_relu).
  void fuse_relu() { fuse_relu_ = true; }
  // After fuse_relu: applies the max pooling that follows the ReLU too (ops::conv2d_relu_maxpool).
  // output_shape still describes the convolution's output (and the fused MaxPool2D's the pooled
  // one), so shapes and multiply-adds chain through the layers as without fusion.
  void fuse_maxpool(ops::MaxPool2dOptions pool) { fused_pool_ = pool; }
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::string name_;
  int kernel_, stride_, padding_;
  bool fuse_relu_ = false;
  std::optional<ops::MaxPool2dOptions> fused_pool_;
  Tensor weight_, bias_;  // [out_c, in_c, k, k], [out_c]
};

class MaxPool2D : public Module {
 public:
  MaxPool2D(int kernel, int stride, int padding = 0) : kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override {
    return fused_ ? x : ops::maxpool2d(x, kernel_, stride_, padding_);
  }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  ops::MaxPool2dOptions options() const { return {kernel_, stride_, padding_}; }
  // The convolution before applies this pooling itself; forward passes its input through.
  void mark_fused() { fused_ = true; }

 private:
  int kernel_, stride_, padding_;
  bool fused_ = false;
};

// BatchNorm2d with PyTorch's defaults: eps 1e-5, momentum 0.1, affine, running statistics tracked.
// Parameters weight (ones) and bias (zeros); buffers running_mean (zeros), running_var (ones) and
// num_batches_tracked (an int64 scalar in files; counted here in a float, exact to 2^24 steps).
class BatchNorm2d : public Module {
 public:
  BatchNorm2d(std::string name, int64_t channels);
  Tensor forward(const Tensor& x) override;
  Shape output_shape(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::vector<NamedTensor> named_buffers() const override;
  std::string describe() const override;
  void sync_batch_statistics(CrossReplicaSum* sync) override { sync_ = sync; }

 private:
  std::string name_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
  CrossReplicaSum* sync_ = nullptr;
};

// [C, H, W] -> [C]: the mean of each channel (AdaptiveAvgPool2d(1) followed by flatten).
class GlobalAvgPool : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::global_avgpool(x); }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override { return "GlobalAvgPool"; }
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

// torchvision's residual blocks: out = relu(path(x) + shortcut(x)), where path is conv-BN pairs with
// ReLU between them and shortcut is x itself, or "downsample" (a 1x1 convolution with the block's
// stride and a BN) when the stride or the channel count changes.
//   BasicBlock: 3x3 (stride) - 3x3, out channels = planes
//   Bottleneck: 1x1 - 3x3 (stride, as torchvision's v1.5) - 1x1, out channels = 4 planes
// Convolutions have no bias (the BN after each has one). Tensor names as torchvision's:
// "<name>.conv1.weight", "<name>.bn1.running_var", "<name>.downsample.0.weight", ...
class ResidualBlock : public Module {
 public:
  enum class Kind { kBasic, kBottleneck };
  ResidualBlock(Kind kind, const std::string& name, int64_t in_channels, int64_t planes, int stride);
  Tensor forward(const Tensor& x) override;
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::vector<NamedTensor> named_buffers() const override;
  std::string describe() const override;
  void set_training(bool on) override;
  void sync_batch_statistics(CrossReplicaSum* sync) override;
  // Every convolution's weight, for initialisation.
  std::vector<const Conv2D*> convolutions() const;
  int64_t out_channels() const { return out_channels_; }

 private:
  struct ConvBn {
    std::unique_ptr<Conv2D> conv;
    std::unique_ptr<BatchNorm2d> bn;
  };
  Kind kind_;
  int64_t in_channels_, out_channels_;
  int stride_;
  std::vector<ConvBn> path_;
  std::optional<ConvBn> downsample_;
};

class Sequential : public Module {
 public:
  void add(std::unique_ptr<Module> layer) { layers_.push_back(std::move(layer)); }
  Tensor forward(const Tensor& x) override;
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::vector<NamedTensor> named_buffers() const override;
  std::string describe() const override;
  void set_training(bool on) override;
  void reseed(uint64_t stream_seed) override;
  void sync_batch_statistics(CrossReplicaSum* sync) override;

  std::size_t size() const { return layers_.size(); }
  Module& layer(std::size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::unique_ptr<Module>> layers_;
};

int64_t parameter_count(const Module& module);
// Parameters, then buffers: what a PyTorch state_dict holds (in another order).
std::vector<NamedTensor> state_tensors(const Module& module);

}  // namespace dptrain::layers
