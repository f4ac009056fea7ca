// Loading a model's parameters and buffers from a safetensors file by name.
#include <set>

#include "core/error.h"
#include "layers/build.h"

namespace dptrain::layers {

void load_parameters(const Module& model, const safetensors::File& file, const std::string& source,
                     const std::string& ignored_prefix) {
  std::set<std::string> expected;
  for (const NamedTensor& p : state_tensors(model)) {
    expected.insert(p.name);
    const Tensor* found = file.find(p.name);
    DPTRAIN_CHECK(found, source, ": tensor '", p.name, "' is missing (the model has it, the file does not)");
    DPTRAIN_CHECK(found->shape() == p.tensor.shape(), source, ": tensor '", p.name, "' has shape ",
                  shape_str(found->shape()), " but the model expects ", shape_str(p.tensor.shape()));
    p.tensor.copy_from(*found);
  }
  for (const NamedTensor& t : file.tensors) {
    const bool ignored = !ignored_prefix.empty() && t.name.starts_with(ignored_prefix);
    DPTRAIN_CHECK(ignored || expected.count(t.name), source, ": tensor '", t.name,
                  "' does not belong to the model (its tensors are named as PyTorch's state_dict: \"{layer "
                  "index}.weight\" "
                  "in a layer list, \"layer1.0.conv1.weight\" in a ResNet)");
  }
}

}  // namespace dptrain::layers
