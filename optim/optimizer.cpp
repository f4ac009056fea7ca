// SGD and Adam: the per-step scalars, computed as torch.optim (1.13) computes them, and one fused
// update over the flat buffers through the parameters' backend.
#include "optim/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace dptrain::optim {

Optimizer::Optimizer(const FlatParameters& parameters, std::vector<FlatRange> owned)
    : parameters_(parameters), backend_(backend_for(parameters.device())), sharded_(!owned.empty()) {
  if (owned.empty()) owned.push_back({0, parameters.size()});
  int64_t state_offset = 0;
  for (const FlatRange& range : owned) {
    DPTRAIN_CHECK(range.offset >= 0 && range.numel >= 0 && range.end() <= parameters_.size(),
                  "optimizer shard [", range.offset, ", ", range.end(), ") outside the ", parameters_.size(),
                  " elements of the flat parameters");
    pieces_.push_back({.range = range, .state_offset = state_offset});
    state_offset += range.numel;
  }
}

Tensor Optimizer::new_slot() const {
  int64_t elements = 0;
  for (const Piece& p : pieces_) elements += p.range.numel;
  return sharded_ ? Tensor::zeros({elements}, parameters_.device()) : parameters_.new_buffer();
}

void Optimizer::add_slot(const std::string& slot) {
  slot_names_.push_back(slot);
  slots_.push_back(new_slot());
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const Tensor& slot : slots_) bytes += slot.numel() * static_cast<int64_t>(sizeof(float));
  return bytes;
}

void Optimizer::step(float lr, float grad_scale) {
  ++steps_;
  // A parameter that received no gradient (unused branch) still decays and moves with momentum, as
  // in PyTorch when its grad is zero-filled; zeros here keep ranks in lockstep.
  update(lr, grad_scale);
}

std::vector<Tensor> Optimizer::whole_state_buffers() const {
  std::vector<Tensor> whole;
  for (const Tensor& slot : slots_) {
    if (!sharded_) {
      whole.push_back(slot.clone());
      continue;
    }
    whole.push_back(parameters_.new_buffer());
    for (const Piece& p : pieces_)
      backend_.copy(whole.back().data_ptr() + p.range.offset, slot.data_ptr() + p.state_offset,
                    sizeof(float) * static_cast<std::size_t>(p.range.numel));
  }
  return whole;
}

void Optimizer::take_state_from(const std::vector<Tensor>& whole) {
  DPTRAIN_CHECK(whole.size() == slots_.size(), "optimizer state: ", whole.size(), " buffers for ",
                slots_.size(), " slots");
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    DPTRAIN_CHECK(whole[s].numel() == parameters_.size(), "optimizer state: a buffer of ", whole[s].numel(),
                  " elements for the ", parameters_.size(), " of the flat layout");
    for (const Piece& p : pieces_)
      backend_.copy(slots_[s].data_ptr() + p.state_offset, whole[s].data_ptr() + p.range.offset,
                    sizeof(float) * static_cast<std::size_t>(p.range.numel));
  }
}

std::vector<NamedTensor> Optimizer::named_state(const std::vector<Tensor>& whole) const {
  DPTRAIN_CHECK(whole.size() == slots_.size(), "optimizer state: ", whole.size(), " buffers for ",
                slots_.size(), " slots");
  std::vector<NamedTensor> out;
  for (std::size_t s = 0; s < whole.size(); ++s) {
    DPTRAIN_CHECK(whole[s].numel() == parameters_.size(), "optimizer state of slot ", slot_names_[s],
                  " is sharded (", whole[s].numel(), " of ", parameters_.size(),
                  " elements): gather it first (whole_state_buffers)");
    for (NamedTensor& t : parameters_.windows(whole[s], slot_names_[s])) out.push_back(std::move(t));
  }
  return out;
}

Tensor Optimizer::state_of(const std::string& parameter, const std::string& slot) const {
  for (NamedTensor& t : state())
    if (t.name == parameter + "." + slot) return t.tensor;
  return {};
}

Sgd::Sgd(const FlatParameters& parameters, SgdOptions options, std::vector<FlatRange> owned)
    : Optimizer(parameters, std::move(owned)), options_(options) {
  DPTRAIN_CHECK(!options_.nesterov || (options_.momentum > 0 && options_.dampening == 0),
                "sgd: nesterov needs momentum > 0 and dampening 0 (as in PyTorch)");
  if (options_.momentum != 0.0f) add_slot("momentum_buffer");
}

void Sgd::update(float lr, float grad_scale) {
  const SgdStep s{.lr = lr,
                  .momentum = options_.momentum,
                  .dampening = options_.dampening,
                  .weight_decay = options_.weight_decay,
                  .grad_scale = grad_scale,
                  .nesterov = options_.nesterov,
                  .first_step = steps_ == 1,
                  .skip_if_set = skip_flag_};
  float* momentum = options_.momentum != 0.0f ? slot_ptr(0) : nullptr;
  for (const Piece& p : pieces())
    backend_.sgd_step(parameters_.values().data_ptr() + p.range.offset,
                      parameters_.grads().data_ptr() + p.range.offset,
                      momentum != nullptr ? momentum + p.state_offset : nullptr, p.range.numel, s);
}

Adam::Adam(const FlatParameters& parameters, AdamOptions options, std::vector<FlatRange> owned)
    : Optimizer(parameters, std::move(owned)), options_(options) {
  add_slot("exp_avg");
  add_slot("exp_avg_sq");
}

void Adam::update(float lr, float grad_scale) {
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
                   .grad_scale = grad_scale,
                   .skip_if_set = skip_flag_};
  for (const Piece& p : pieces())
    backend_.adam_step(parameters_.values().data_ptr() + p.range.offset,
                       parameters_.grads().data_ptr() + p.range.offset, slot_ptr(0) + p.state_offset,
                       slot_ptr(1) + p.state_offset, p.range.numel, s);
}

}  // namespace dptrain::optim
