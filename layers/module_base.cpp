// Container's walks over its children, and the functions of a whole model's tensors.
#include "layers/module_base.h"

namespace dptrain::layers {

std::vector<NamedTensor> Container::named_parameters() const {
  std::vector<NamedTensor> out;
  for (const auto& child : children_)
    for (NamedTensor& p : child->named_parameters()) out.push_back(std::move(p));
  return out;
}

std::vector<NamedTensor> Container::named_buffers() const {
  std::vector<NamedTensor> out;
  for (const auto& child : children_)
    for (NamedTensor& b : child->named_buffers()) out.push_back(std::move(b));
  return out;
}

void Container::sync_batch_statistics(CrossReplicaSum* sync) {
  for (auto& child : children_) child->sync_batch_statistics(sync);
}

void Container::set_training(bool on) {
  Module::set_training(on);
  for (auto& child : children_) child->set_training(on);
}

void Container::reseed(uint64_t stream_seed) {
  for (auto& child : children_) child->reseed(stream_seed);
}

std::vector<NamedTensor> weight_and_bias(const std::string& name, const Tensor& weight, const Tensor& bias) {
  const std::string prefix = name + ".";
  std::vector<NamedTensor> out{{prefix + "weight", weight}};
  if (bias.defined()) out.push_back({prefix + "bias", bias});
  return out;
}

int64_t parameter_count(const Module& module) {
  int64_t n = 0;
  for (const NamedTensor& p : module.named_parameters()) n += p.tensor.numel();
  return n;
}

std::vector<NamedTensor> state_tensors(const Module& module) {
  std::vector<NamedTensor> out = module.named_parameters();
  for (NamedTensor& b : module.named_buffers()) out.push_back(std::move(b));
  return out;
}

}  // namespace dptrain::layers
