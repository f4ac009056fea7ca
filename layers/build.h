// Building a Sequential model from the config's `model.layers` list, initialising its parameters,
// and loading them from a safetensors file (`model.init_from`).
#pragma once

#include <memory>
#include <string>

#include "core/config_reader.h"
#include "core/safetensors.h"
#include "layers/module.h"

namespace dptrain::layers {

// Each item of `layers` is an object with a "type" registered in registry.cpp (layer_type_names():
// "dense", "conv2d", "batchnorm2d", ...) and that type's keys (its factory, in the layer's own file,
// reads them); `path` prefixes error messages ("model.layers").
std::unique_ptr<Sequential> build_sequential(const Json& layers, const Shape& input_shape, uint64_t seed,
                                             const std::string& path = "model.layers");

// An architecture registered in registry.cpp (architecture_names(): the ResNets of resnet.cpp, with
// torchvision's tensor names) with `num_classes` outputs.
std::unique_ptr<Sequential> build_architecture(const std::string& architecture, const Shape& input_shape,
                                               int64_t num_classes, uint64_t seed);

// Copies every parameter and buffer of `model` from `file`; a missing tensor, a wrong shape or a tensor the
// model does not have is an error naming the tensor and `source`. Names under `ignored_prefix` are skipped.
void load_parameters(const Module& model, const safetensors::File& file, const std::string& source,
                     const std::string& ignored_prefix = "");

}  // namespace dptrain::layers
