// The lists of layer types and architectures, one entry each. A list in one file rather than
// self-registering objects: the linker keeps an object file of a static library only when something
// references it, and these arrays reference every entry, so any binary that builds a model holds all
// of them (a layer whose file is not compiled in fails the link instead of vanishing at run time).
#include "layers/registry.h"

#include <algorithm>

#include "core/registry.h"

namespace dptrain::layers {

// Defined in the layers' and architectures' own files: a new one adds its line here and its entry below.
extern const LayerType kDenseLayer;
extern const LayerType kConv2dLayer;
extern const LayerType kMaxPool2dLayer;
extern const LayerType kBatchNorm2dLayer;
extern const LayerType kGlobalAvgPoolLayer;
extern const LayerType kBasicBlockLayer;
extern const LayerType kBottleneckLayer;
extern const LayerType kReluLayer;
extern const LayerType kTanhLayer;
extern const LayerType kSigmoidLayer;
extern const LayerType kFlattenLayer;
extern const LayerType kDropoutLayer;
extern const LayerType kBatchNorm1dLayer;
extern const Architecture kResnet18, kResnet34, kResnet50, kResnet20;

namespace {

// In the order the error for an unknown type lists them.
const LayerType* const kLayerTypes[] = {
    &kDenseLayer,      &kConv2dLayer,     &kMaxPool2dLayer,   &kBatchNorm2dLayer, &kGlobalAvgPoolLayer,
    &kBasicBlockLayer, &kBottleneckLayer, &kReluLayer,        &kTanhLayer,        &kSigmoidLayer,
    &kFlattenLayer,    &kDropoutLayer,    &kBatchNorm1dLayer,
};

const Architecture* const kArchitectures[] = {&kResnet18, &kResnet34, &kResnet50, &kResnet20};

}  // namespace

const LayerType& layer_type(const std::string& type, const std::string& path) {
  for (const LayerType* t : kLayerTypes)
    if (type == t->name) return *t;
  DPTRAIN_FAIL("config key ", path, " = \"", type, "\" is not a layer type; use ",
               quoted_alternatives(layer_type_names()));
}

std::vector<std::string> layer_type_names() {
  return registered_names<LayerType>(kLayerTypes);
}

const Architecture& architecture(const std::string& name) {
  for (const Architecture* a : kArchitectures)
    if (name == a->name) return *a;
  DPTRAIN_FAIL("config key model.architecture", architecture_name_problem(name));
}

std::vector<std::string> architecture_names() {
  return registered_names<Architecture>(kArchitectures);
}

std::string architecture_name_problem(const std::string& name) {
  const std::vector<std::string> names = architecture_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return "";
  return " = \"" + name + "\" is not an architecture; use " + quoted_alternatives(names);
}

}  // namespace dptrain::layers
