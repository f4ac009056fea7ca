// SGD and Adam updates, written to follow torch.optim (1.13) operation by operation.
#include "optim/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace dptrain::optim {

Optimizer::Optimizer(std::vector<NamedTensor> parameters) : parameters_(std::move(parameters)) {
  for (const NamedTensor& p : parameters_)
    DPTRAIN_CHECK(p.tensor.defined(), "optimizer: parameter '", p.name, "' is undefined");
}

void Optimizer::add_slot(const std::string& slot) {
  slot_names_.push_back(slot);
  std::vector<Tensor>& tensors = slots_.emplace_back();
  for (const NamedTensor& p : parameters_) tensors.push_back(Tensor::zeros(p.tensor.shape()));
}

void Optimizer::step(float lr) {
  ++steps_;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i].tensor;
    // A parameter that received no gradient (unused branch) still decays and moves with momentum,
    // as in PyTorch when its grad is zero-filled; zeros here keep ranks in lockstep.
    update(i, p.data(), p.grad_data(), p.numel(), lr);
  }
}

void Optimizer::zero_grad() {
  for (const NamedTensor& p : parameters_) p.tensor.zero_grad();
}

std::vector<NamedTensor> Optimizer::state() const {
  std::vector<NamedTensor> out;
  for (std::size_t s = 0; s < slots_.size(); ++s)
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      out.push_back({parameters_[i].name + "." + slot_names_[s], slots_[s][i]});
  return out;
}

Tensor Optimizer::state_of(const std::string& parameter, const std::string& slot) const {
  for (std::size_t s = 0; s < slots_.size(); ++s)
    if (slot_names_[s] == slot)
      for (std::size_t i = 0; i < parameters_.size(); ++i)
        if (parameters_[i].name == parameter) return slots_[s][i];
  return {};
}

Sgd::Sgd(std::vector<NamedTensor> parameters, SgdOptions options)
    : Optimizer(std::move(parameters)), options_(options) {
  DPTRAIN_CHECK(!options_.nesterov || (options_.momentum > 0 && options_.dampening == 0),
                "sgd: nesterov needs momentum > 0 and dampening 0 (as in PyTorch)");
  if (options_.momentum != 0.0f) add_slot("momentum_buffer");
}

void Sgd::update(std::size_t index, float* param, const float* grad, int64_t n, float lr) {
  const float wd = options_.weight_decay, momentum = options_.momentum, dampening = options_.dampening;
  const bool nesterov = options_.nesterov;
  float* __restrict out = param;
  const float* __restrict g_in = grad;
  if (momentum == 0.0f) {
    for (int64_t i = 0; i < n; ++i) out[i] += -lr * (g_in[i] + wd * out[i]);
    return;
  }
  float* __restrict buf = slot_data(0, index);
  // PyTorch starts the buffer as a copy of the first gradient (no dampening on step 1).
  const float keep = steps_ == 1 ? 0.0f : momentum, add = steps_ == 1 ? 1.0f : 1.0f - dampening;
  for (int64_t i = 0; i < n; ++i) {
    const float d = g_in[i] + wd * out[i];
    buf[i] = buf[i] * keep + add * d;
    out[i] += -lr * (nesterov ? d + momentum * buf[i] : buf[i]);
  }
}

Adam::Adam(std::vector<NamedTensor> parameters, AdamOptions options)
    : Optimizer(std::move(parameters)), options_(options) {
  add_slot("exp_avg");
  add_slot("exp_avg_sq");
}

void Adam::update(std::size_t index, float* param, const float* grad, int64_t n, float lr) {
  const AdamOptions& o = options_;
  // Scalars in double, as Python computes them, then rounded to float as the kernels do.
  const double step = static_cast<double>(steps_);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(o.beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(o.beta2), step);
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = o.decoupled_weight_decay ? static_cast<float>(1.0 - static_cast<double>(lr) * o.weight_decay) : 1.0f;
  const float l2 = o.decoupled_weight_decay ? 0.0f : o.weight_decay;
  // Locals and restrict pointers: with the options read through `this`, GCC assumes the stores
  // below may change them and does not vectorise the loop.
  const float beta1 = o.beta1, beta2 = o.beta2, eps = o.eps;
  float* __restrict m = slot_data(0, index);
  float* __restrict v = slot_data(1, index);
  float* __restrict out = param;
  const float* __restrict g_in = grad;
  for (int64_t i = 0; i < n; ++i) {
    const float p = out[i] * decay;
    const float g = g_in[i] + l2 * p;
    m[i] = m[i] * beta1 + (1.0f - beta1) * g;
    v[i] = v[i] * beta2 + (1.0f - beta2) * g * g;
    const float denom = std::sqrt(v[i]) / bias_correction2_sqrt + eps;
    out[i] = p - step_size * m[i] / denom;
  }
}

}  // namespace dptrain::optim
