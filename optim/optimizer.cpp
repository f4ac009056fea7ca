// SGD and Adam: the per-step scalars, computed as torch.optim (1.13) computes them, and one fused
// update over the flat buffers through the parameters' backend.
#include "optim/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace dptrain::optim {

Optimizer::Optimizer(const FlatParameters& parameters)
    : parameters_(parameters), backend_(backend_for(parameters.device())) {}

void Optimizer::add_slot(const std::string& slot) {
  slot_names_.push_back(slot);
  slots_.push_back(parameters_.new_buffer());
}

void Optimizer::step(float lr) {
  ++steps_;
  // A parameter that received no gradient (unused branch) still decays and moves with momentum, as
  // in PyTorch when its grad is zero-filled; zeros here keep ranks in lockstep.
  update(lr);
}

std::vector<NamedTensor> Optimizer::state() const {
  std::vector<NamedTensor> out;
  for (std::size_t s = 0; s < slots_.size(); ++s)
    for (NamedTensor& t : parameters_.windows(slots_[s], slot_names_[s])) out.push_back(std::move(t));
  return out;
}

Tensor Optimizer::state_of(const std::string& parameter, const std::string& slot) const {
  for (NamedTensor& t : state())
    if (t.name == parameter + "." + slot) return t.tensor;
  return {};
}

Sgd::Sgd(const FlatParameters& parameters, SgdOptions options) : Optimizer(parameters), options_(options) {
  DPTRAIN_CHECK(!options_.nesterov || (options_.momentum > 0 && options_.dampening == 0),
                "sgd: nesterov needs momentum > 0 and dampening 0 (as in PyTorch)");
  if (options_.momentum != 0.0f) add_slot("momentum_buffer");
}

void Sgd::update(float lr) {
  const SgdStep s{.lr = lr,
                  .momentum = options_.momentum,
                  .dampening = options_.dampening,
                  .weight_decay = options_.weight_decay,
                  .nesterov = options_.nesterov,
                  .first_step = steps_ == 1,
                  .skip_if_set = skip_flag_};
  backend_.sgd_step(parameters_.values().data_ptr(), parameters_.grads().data_ptr(),
                    options_.momentum != 0.0f ? slot_ptr(0) : nullptr, parameters_.size(), s);
}

Adam::Adam(const FlatParameters& parameters, AdamOptions options) : Optimizer(parameters), options_(options) {
  add_slot("exp_avg");
  add_slot("exp_avg_sq");
}

void Adam::update(float lr) {
  const AdamOptions& o = options_;
  // Scalars in double, as Python computes them, then rounded to float as the kernels do.
  const double step = static_cast<double>(steps_);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(o.beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(o.beta2), step);
  const AdamStep s{.beta1 = o.beta1,
                   .beta2 = o.beta2,
                   .eps = o.eps,
                   .step_size = static_cast<float>(lr / bias_correction1),
                   .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
                   .decay = o.decoupled_weight_decay
                                ? static_cast<float>(1.0 - static_cast<double>(lr) * o.weight_decay)
                                : 1.0f,
                   .l2 = o.decoupled_weight_decay ? 0.0f : o.weight_decay,
                   .skip_if_set = skip_flag_};
  backend_.adam_step(parameters_.values().data_ptr(), parameters_.grads().data_ptr(), slot_ptr(0),
                     slot_ptr(1), parameters_.size(), s);
}

}  // namespace dptrain::optim
