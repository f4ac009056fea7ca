// Batch normalisation: BatchNorm, what every rank of it shares (PyTorch's _BatchNorm), and BatchNorm2d.
#pragma once

#include <string>

#include "layers/module_base.h"

namespace dptrain::layers {

// PyTorch's defaults: eps 1e-5, momentum 0.1, affine, running statistics tracked. Parameters weight
// (ones) and bias (zeros); buffers running_mean (zeros), running_var (ones) and num_batches_tracked
// (an int64 scalar in files; counted here in a float, exact to 2^24 steps). Statistics are per channel,
// dimension 1 of the batch, over every other dimension; the subclasses say which per-sample shapes
// they take.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  // relu(forward(x) + residual) in the normalising pass (ops::BatchNormOptions: the same numbers,
  // one pass over memory instead of three); residual may be undefined.
  Tensor forward(const Tensor& x, const Tensor& residual, bool relu);
  // Applies the ReLU that follows this layer itself (Sequential's fusion; forward(x) then returns
  // relu(batch_norm(x))).
  void fuse_relu() { fused_relu_ = true; }
  std::vector<NamedTensor> named_parameters() const override;
  std::vector<NamedTensor> named_buffers() const override;
  void sync_batch_statistics(CrossReplicaSum* sync) override { sync_ = sync; }
  int64_t channels() const { return weight_.dim(0); }

 protected:
  BatchNorm(std::string name, int64_t channels);
  const std::string& name() const { return name_; }
  // "<type>(<channels>)", noting synchronisation across ranks.
  std::string describe_as(const std::string& type) const;

 private:
  std::string name_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
  CrossReplicaSum* sync_ = nullptr;
  bool fused_relu_ = false;
};

// Per sample [C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  BatchNorm2d(std::string name, int64_t channels) : BatchNorm(std::move(name), channels) {}
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override { return describe_as("BatchNorm2d"); }
};

}  // namespace dptrain::layers
