// Module, what every layer is, and Container, a module made of child modules that it walks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
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

// flashlight's Container: a module made of the children it owns. The walks every composite needs are
// here once, in the order the children were added, which is the order their tensors are named in (a
// checkpoint's and PyTorch's state_dict order): a composite writes forward and shapes, nothing else.
class Container : public Module {
 public:
  std::vector<NamedTensor> named_parameters() const override;
  std::vector<NamedTensor> named_buffers() const override;
  void sync_batch_statistics(CrossReplicaSum* sync) override;
  void set_training(bool on) override;
  void reseed(uint64_t stream_seed) override;

 protected:
  // Returns the child as its own type, for the composite's forward to call.
  template <typename M>
  M& add_child(std::unique_ptr<M> child) {
    M& added = *child;
    children_.push_back(std::move(child));
    return added;
  }
  const std::vector<std::unique_ptr<Module>>& children() const { return children_; }

 private:
  std::vector<std::unique_ptr<Module>> children_;
};

// "<name>.weight" and, when defined, "<name>.bias": PyTorch's names for a layer's affine parameters.
std::vector<NamedTensor> weight_and_bias(const std::string& name, const Tensor& weight, const Tensor& bias);

int64_t parameter_count(const Module& module);
// Parameters, then buffers: what a PyTorch state_dict holds (in another order).
std::vector<NamedTensor> state_tensors(const Module& module);

}  // namespace dptrain::layers
