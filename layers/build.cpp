// Model construction from the config: a layer list through the layer registry, or a named
// architecture through the architecture registry (registry.h).
#include "layers/build.h"

#include "core/error.h"
#include "layers/registry.h"

namespace dptrain::layers {
namespace {

// conv2d followed by relu: one kernel does both (same numbers, one pass less over the activation);
// and by a max pooling after that, one kernel does all three (the conv output never stored).
void fuse_conv_relu_maxpool(Sequential& model) {
  for (std::size_t i = 0; i + 1 < model.size(); ++i) {
    auto* conv = dynamic_cast<Conv2D*>(&model.layer(i));
    auto* act = dynamic_cast<ActivationLayer*>(&model.layer(i + 1));
    if (!conv || !act || act->kind() != Activation::kRelu) continue;
    conv->fuse_relu();
    act->mark_fused();
    auto* pool = i + 2 < model.size() ? dynamic_cast<MaxPool2D*>(&model.layer(i + 2)) : nullptr;
    if (pool) {
      conv->fuse_maxpool(pool->options());
      pool->mark_fused();
    }
  }
}

// batchnorm1d or batchnorm2d followed by relu: the normalising pass applies the ReLU (the same
// numbers; ReLU's own passes over the activation, forward and backward, are gone).
void fuse_batchnorm_relu(Sequential& model) {
  for (std::size_t i = 0; i + 1 < model.size(); ++i) {
    auto* bn = dynamic_cast<BatchNorm*>(&model.layer(i));
    auto* act = dynamic_cast<ActivationLayer*>(&model.layer(i + 1));
    if (!bn || !act || act->kind() != Activation::kRelu) continue;
    bn->fuse_relu();
    act->mark_fused();
  }
}

void fuse_layers(Sequential& model) {
  fuse_conv_relu_maxpool(model);
  fuse_batchnorm_relu(model);
}

}  // namespace

std::unique_ptr<Sequential> build_sequential(const Json& layers, const Shape& input_shape, uint64_t seed,
                                             const std::string& path) {
  DPTRAIN_CHECK(layers.is_array() && !layers.empty(), "config key ", path,
                ": expected a non-empty list of layers");
  auto model = std::make_unique<Sequential>();
  Shape shape = input_shape;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    ObjectReader reader(layers[i], path + "[" + std::to_string(i) + "]");
    const LayerType& type = layer_type(reader.require<std::string>("type"), reader.path_of("type"));
    model->add(type.build({.config = reader, .input = shape, .name = std::to_string(i), .seed = seed}));
    reader.finish();
    try {
      shape = model->layer(i).output_shape(shape);
    } catch (const Error& e) {
      DPTRAIN_FAIL("config key ", path, "[", i, "]: ", e.what());
    }
  }
  fuse_layers(*model);
  return model;
}

std::unique_ptr<Sequential> build_architecture(const std::string& architecture_name, const Shape& input_shape,
                                               int64_t num_classes, uint64_t seed) {
  const Architecture& architecture = layers::architecture(architecture_name);
  DPTRAIN_CHECK(num_classes >= 1, "config key model.num_classes must be >= 1");
  auto model = architecture.build(input_shape, num_classes, seed);
  fuse_layers(*model);
  try {
    model->output_shape(input_shape);
  } catch (const Error& e) {
    DPTRAIN_FAIL("config key model.input_shape = ", shape_str(input_shape), " does not fit ",
                 architecture_name, ": ", e.what());
  }
  return model;
}

}  // namespace dptrain::layers
