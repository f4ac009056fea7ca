// Optimizers over named parameters (never layers): SGD with momentum/dampening/nesterov/weight
// decay and Adam/AdamW, with PyTorch's exact update formulas. State is addressable by parameter name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dptrain::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<NamedTensor> parameters);
  virtual ~Optimizer() = default;

  // One update with learning rate `lr` from the gradients currently in the parameters.
  void step(float lr);
  void zero_grad();
  int64_t steps_taken() const { return steps_; }

  // Every state tensor, named "<parameter>.<slot>" (e.g. "0.weight.exp_avg"); with steps_taken(),
  // everything a broadcast or a checkpoint must carry.
  std::vector<NamedTensor> state() const;
  // The tensor of one slot of one parameter's state, or undefined if there is no such slot.
  Tensor state_of(const std::string& parameter, const std::string& slot) const;
  // Restores the step counter after state() tensors were overwritten in place.
  void set_steps_taken(int64_t steps) { steps_ = steps; }

  const std::vector<NamedTensor>& parameters() const { return parameters_; }

 protected:
  virtual void update(std::size_t index, float* param, const float* grad, int64_t n, float lr) = 0;
  // Called from subclass constructors: one zero tensor per parameter and slot.
  void add_slot(const std::string& slot);
  float* slot_data(std::size_t slot, std::size_t parameter) const { return slots_[slot][parameter].data(); }

  int64_t steps_ = 0;  // updates taken so far, as PyTorch's per-parameter "step"

 private:
  std::vector<NamedTensor> parameters_;
  std::vector<std::string> slot_names_;
  std::vector<std::vector<Tensor>> slots_;  // [slot][parameter]
};

struct SgdOptions {
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<NamedTensor> parameters, SgdOptions options);

 private:
  void update(std::size_t index, float* param, const float* grad, int64_t n, float lr) override;
  SgdOptions options_;
};

struct AdamOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // AdamW
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<NamedTensor> parameters, AdamOptions options);

 private:
  void update(std::size_t index, float* param, const float* grad, int64_t n, float lr) override;
  AdamOptions options_;
};

}  // namespace dptrain::optim
