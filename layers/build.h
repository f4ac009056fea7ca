// Building a Sequential model from the config's `model.layers` list, initialising its parameters,
// and loading them from a safetensors file (`model.init_from`).
#pragma once

#include <memory>
#include <string>

#include "core/config_reader.h"
#include "core/safetensors.h"
#include "layers/module.h"

namespace dptrain::layers {

// Each item of `layers` is an object with a "type" (dense, conv2d, maxpool2d, batchnorm2d,
// global_avgpool, basic_block, bottleneck, relu, tanh, sigmoid, flatten, dropout) and that type's
// keys; `path` prefixes error messages ("model.layers").
std::unique_ptr<Sequential> build_sequential(const Json& layers, const Shape& input_shape, uint64_t seed,
                                             const std::string& path = "model.layers");

// "resnet18", "resnet34", "resnet50" (torchvision's layout and initialisation; conv1 takes
// input_shape[0] channels) or "resnet20" (He et al. 2016, section 4.2, with 1x1-conv shortcuts), with
// `num_classes` outputs. Tensor names equal torchvision's state_dict keys.
std::unique_ptr<Sequential> build_architecture(const std::string& architecture, const Shape& input_shape,
                                               int64_t num_classes, uint64_t seed);

// Copies every parameter and buffer of `model` from `file`; a missing tensor, a wrong shape or a tensor the
// model does not have is an error naming the tensor and `source`. Names under `ignored_prefix` are skipped.
void load_parameters(const Module& model, const safetensors::File& file, const std::string& source,
                     const std::string& ignored_prefix = "");

}  // namespace dptrain::layers
