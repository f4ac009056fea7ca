// The registries of the config's layer types (model.layers[i].type) and architectures
// (model.architecture): each entry is defined in its own file and listed in registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config_reader.h"
#include "layers/module_base.h"
#include "layers/sequential.h"

namespace dptrain::layers {

// What build_sequential hands a layer's factory.
struct LayerContext {
  // The layer's JSON object: every key the factory reads counts as used, and the caller rejects the
  // rest after the factory returns. "type" is read already.
  ObjectReader& config;
  const Shape& input;  // per sample
  // PyTorch's name of the layer in an nn.Sequential, its index ("3"): its tensors are "3.weight", ...
  std::string name;
  // Each parameter's initial values come from derive_seed(seed, its tensor name), so they do not
  // depend on the order of layers or on which other layers draw.
  uint64_t seed;
};

struct LayerType {
  const char* name;  // as the config spells "type"
  std::unique_ptr<Module> (*build)(const LayerContext& context);
};

// The factory of a layer that reads no keys and has no parameters.
template <typename M>
std::unique_ptr<Module> build_keyless(const LayerContext& /*context*/) {
  return std::make_unique<M>();
}

// The type `type` read from the config key `path` ("model.layers[2].type"); an unknown one is an
// error listing the registered ones.
const LayerType& layer_type(const std::string& type, const std::string& path);
std::vector<std::string> layer_type_names();

struct Architecture {
  const char* name;  // as the config spells model.architecture
  // input_shape is per sample; num_classes >= 1 (checked before).
  std::unique_ptr<Sequential> (*build)(const Shape& input_shape, int64_t num_classes, uint64_t seed);
};

const Architecture& architecture(const std::string& name);
std::vector<std::string> architecture_names();
// What is wrong with `name` as model.architecture, as the rest of a message that begins "config key
// model.architecture"; empty for a registered name (the config's check and architecture() say it alike).
std::string architecture_name_problem(const std::string& name);

}  // namespace dptrain::layers
