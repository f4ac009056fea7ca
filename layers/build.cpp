// Model construction from JSON, parameter initialisers and loading weights by name.
#include "layers/build.h"

#include <cmath>
#include <set>

#include "core/error.h"

namespace dptrain::layers {
namespace {

// An initialiser: "default" (PyTorch's: kaiming_uniform with a = sqrt(5) for weights, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for biases), "kaiming_uniform" (He, for
// ReLU: U(-sqrt(6/fan_in), +)), "glorot_uniform" (U(-sqrt(6/(fan_in+fan_out)), +)), "zeros", "ones",
// or a number (constant).
struct Initializer {
  enum class Kind { kDefault, kKaimingUniform, kGlorotUniform, kConstant } kind = Kind::kDefault;
  float value = 0.0f;
};

Initializer parse_initializer(ObjectReader& reader, const std::string& key, bool for_bias) {
  if (!reader.has(key)) return {};
  const Json& v = reader.raw(key);
  if (v.is_number()) return {Initializer::Kind::kConstant, v.get<float>()};
  const std::string name = ObjectReader::convert<std::string>(v, reader.path_of(key));
  if (name == "default") return {};
  if (name == "zeros") return {Initializer::Kind::kConstant, 0.0f};
  if (name == "ones") return {Initializer::Kind::kConstant, 1.0f};
  if (!for_bias && name == "kaiming_uniform") return {Initializer::Kind::kKaimingUniform};
  if (!for_bias && name == "glorot_uniform") return {Initializer::Kind::kGlorotUniform};
  DPTRAIN_FAIL(
      "config key ", reader.path_of(key), " = \"", name, "\" is not an initialiser; use \"default\", ",
      for_bias ? "" : "\"kaiming_uniform\", \"glorot_uniform\", ", "\"zeros\", \"ones\" or a number");
}

void initialize(const Tensor& t, const Initializer& init, int64_t fan_in, int64_t fan_out, uint64_t seed,
                const std::string& name) {
  Rng rng(derive_seed(seed, name));
  float bound = 0.0f;
  switch (init.kind) {
    case Initializer::Kind::kConstant:
      std::fill_n(t.data(), t.numel(), init.value);
      return;
    case Initializer::Kind::kDefault:
      bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
      break;
    case Initializer::Kind::kKaimingUniform:
      bound = std::sqrt(6.0f / static_cast<float>(fan_in));
      break;
    case Initializer::Kind::kGlorotUniform:
      bound = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
      break;
  }
  for (float& v : t.values()) v = rng.uniform(-bound, bound);
}

std::unique_ptr<Module> build_layer(ObjectReader& r, int index, const Shape& input, uint64_t seed) {
  const std::string type = r.require<std::string>("type");
  if (type == "dense") {
    DPTRAIN_CHECK(input.size() == 1, "config key ", r.path_of("type"),
                  ": dense needs a flat input, gets per-sample ", "shape ", shape_str(input),
                  "; add a {\"type\": \"flatten\"} layer before it");
    DPTRAIN_CHECK(r.has("out_features"), "config key ", r.path_of("out_features"), " is missing (dense)");
    const int64_t out = r.get_in_range<int64_t>("out_features", 1, 1, 1 << 24);
    const bool bias = r.get<bool>("bias", true);
    auto layer = std::make_unique<Dense>(index, input[0], out, bias);
    const Initializer w = parse_initializer(r, "weight_init", false),
                      b = parse_initializer(r, "bias_init", true);
    const std::string p = std::to_string(index) + ".";
    initialize(layer->weight(), w, input[0], out, seed, p + "weight");
    if (bias) initialize(layer->bias(), b, input[0], out, seed, p + "bias");
    return layer;
  }
  if (type == "conv2d") {
    DPTRAIN_CHECK(input.size() == 3, "config key ", r.path_of("type"),
                  ": conv2d needs a [C, H, W] input, gets ", shape_str(input));
    DPTRAIN_CHECK(r.has("out_channels") && r.has("kernel"), "config key ", r.path_of("type"),
                  ": conv2d needs out_channels and kernel");
    const int64_t out = r.get_in_range<int64_t>("out_channels", 1, 1, 1 << 16);
    const int kernel = r.get_in_range("kernel", 1, 1, 64);
    const int stride = r.get_in_range("stride", 1, 1, 64);
    const int padding = r.get_in_range("padding", 0, 0, 64);
    const bool bias = r.get<bool>("bias", true);
    auto layer = std::make_unique<Conv2D>(index, input[0], out, kernel, stride, padding, bias);
    const Initializer w = parse_initializer(r, "weight_init", false),
                      b = parse_initializer(r, "bias_init", true);
    const int64_t fan_in = input[0] * kernel * kernel, fan_out = out * kernel * kernel;
    const std::string p = std::to_string(index) + ".";
    initialize(layer->weight(), w, fan_in, fan_out, seed, p + "weight");
    if (bias) initialize(layer->bias(), b, fan_in, fan_out, seed, p + "bias");
    return layer;
  }
  if (type == "maxpool2d") {
    DPTRAIN_CHECK(r.has("kernel"), "config key ", r.path_of("kernel"), " is missing (maxpool2d)");
    const int kernel = r.get_in_range("kernel", 2, 1, 64);
    return std::make_unique<MaxPool2D>(kernel, r.get_in_range("stride", kernel, 1, 64));
  }
  if (type == "relu") return std::make_unique<ActivationLayer>(Activation::kRelu);
  if (type == "tanh") return std::make_unique<ActivationLayer>(Activation::kTanh);
  if (type == "sigmoid") return std::make_unique<ActivationLayer>(Activation::kSigmoid);
  if (type == "flatten") return std::make_unique<Flatten>();
  if (type == "dropout") {
    const float p = r.get_in_range("p", 0.5f, 0.0f, 0.99f);
    return std::make_unique<Dropout>(index, p);
  }
  DPTRAIN_FAIL(
      "config key ", r.path_of("type"), " = \"", type,
      "\" is not a layer type; use dense, conv2d, maxpool2d, relu, tanh, sigmoid, flatten or dropout");
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
    model->add(build_layer(reader, static_cast<int>(i), shape, seed));
    reader.finish();
    try {
      shape = model->layer(i).output_shape(shape);
    } catch (const Error& e) {
      DPTRAIN_FAIL("config key ", path, "[", i, "]: ", e.what());
    }
  }
  // conv2d followed by relu: one kernel does both (same numbers, one pass less over the activation).
  for (std::size_t i = 0; i + 1 < model->size(); ++i) {
    auto* conv = dynamic_cast<Conv2D*>(&model->layer(i));
    auto* act = dynamic_cast<ActivationLayer*>(&model->layer(i + 1));
    if (conv && act && act->kind() == Activation::kRelu) {
      conv->fuse_relu();
      act->mark_fused();
    }
  }
  return model;
}

void load_parameters(const Module& model, const safetensors::File& file, const std::string& source,
                     const std::string& ignored_prefix) {
  std::set<std::string> expected;
  for (const NamedTensor& p : model.named_parameters()) {
    expected.insert(p.name);
    const Tensor* found = file.find(p.name);
    DPTRAIN_CHECK(found, source, ": tensor '", p.name, "' is missing (the model has it, the file does not)");
    DPTRAIN_CHECK(found->shape() == p.tensor.shape(), source, ": tensor '", p.name, "' has shape ",
                  shape_str(found->shape()), " but the model expects ", shape_str(p.tensor.shape()));
    p.tensor.copy_from(*found);
  }
  for (const NamedTensor& t : file.tensors) {
    const bool ignored = !ignored_prefix.empty() && t.name.starts_with(ignored_prefix);
    DPTRAIN_CHECK(
        ignored || expected.count(t.name), source, ": tensor '", t.name,
        "' does not belong to the model (its parameters are named \"{layer index}.weight\" / \".bias\")");
  }
}

}  // namespace dptrain::layers
