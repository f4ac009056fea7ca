// The optimizer registry: one line per optimizer in kOptimizers.
#include "optim/registry.h"

#include "core/registry.h"

namespace dptrain::optim {
namespace {

std::unique_ptr<Optimizer> make_sgd(const FlatParameters& parameters, const OptimizerSettings& s) {
  return std::make_unique<Sgd>(parameters,
                               SgdOptions{.momentum = static_cast<float>(s.momentum),
                                          .dampening = static_cast<float>(s.dampening),
                                          .nesterov = s.nesterov,
                                          .weight_decay = static_cast<float>(s.weight_decay)},
                               s.owned);
}

AdamOptions adam_options(const OptimizerSettings& s, bool decoupled_weight_decay) {
  return {.beta1 = static_cast<float>(s.beta1),
          .beta2 = static_cast<float>(s.beta2),
          .eps = static_cast<float>(s.eps),
          .weight_decay = static_cast<float>(s.weight_decay),
          .decoupled_weight_decay = decoupled_weight_decay};
}
std::unique_ptr<Optimizer> make_adam(const FlatParameters& parameters, const OptimizerSettings& s) {
  return std::make_unique<Adam>(parameters, adam_options(s, false), s.owned);
}
std::unique_ptr<Optimizer> make_adamw(const FlatParameters& parameters, const OptimizerSettings& s) {
  return std::make_unique<Adam>(parameters, adam_options(s, true), s.owned);
}

constexpr OptimizerEntry kSgd{"sgd", make_sgd}, kAdam{"adam", make_adam}, kAdamW{"adamw", make_adamw};
constexpr const OptimizerEntry* kOptimizers[] = {&kSgd, &kAdam, &kAdamW};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const FlatParameters& parameters,
                                          const OptimizerSettings& settings) {
  return find_registered<OptimizerEntry>(kOptimizers, name, "config key optimizer.type")
      .make(parameters, settings);
}

std::vector<std::string> optimizer_names() {
  return registered_names<OptimizerEntry>(kOptimizers);
}

}  // namespace dptrain::optim
