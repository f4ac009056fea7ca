// Model construction from JSON (a layer list or a named architecture), parameter initialisers and
// loading weights by name.
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

// torchvision's ResNet initialisation of a convolution: kaiming_normal_(mode="fan_out",
// nonlinearity="relu"), i.e. N(0, 2 / (out_channels * kh * kw)).
void kaiming_normal_fan_out(const Conv2D& conv, uint64_t seed, const std::string& name) {
  const Tensor& w = conv.weight();
  const double stddev = std::sqrt(2.0 / static_cast<double>(w.dim(0) * w.dim(2) * w.dim(3)));
  Rng rng(derive_seed(seed, name));
  for (float& v : w.values()) v = static_cast<float>(stddev * rng.normal());
}

std::unique_ptr<ResidualBlock> residual_block(ResidualBlock::Kind kind, const std::string& name,
                                              int64_t in_channels, int64_t planes, int stride,
                                              uint64_t seed) {
  auto block = std::make_unique<ResidualBlock>(kind, name, in_channels, planes, stride);
  for (const Conv2D* conv : block->convolutions())
    kaiming_normal_fan_out(*conv, seed, conv->named_parameters().front().name);
  return block;
}

std::unique_ptr<Module> build_layer(ObjectReader& r, int index, const Shape& input, uint64_t seed) {
  const std::string type = r.require<std::string>("type");
  const std::string name = std::to_string(index);
  if (type == "dense") {
    DPTRAIN_CHECK(input.size() == 1, "config key ", r.path_of("type"),
                  ": dense needs a flat input, gets per-sample ", "shape ", shape_str(input),
                  "; add a {\"type\": \"flatten\"} layer before it");
    DPTRAIN_CHECK(r.has("out_features"), "config key ", r.path_of("out_features"), " is missing (dense)");
    const int64_t out = r.get_in_range<int64_t>("out_features", 1, 1, 1 << 24);
    const bool bias = r.get<bool>("bias", true);
    auto layer = std::make_unique<Dense>(name, input[0], out, bias);
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
    auto layer = std::make_unique<Conv2D>(name, input[0], out, kernel, stride, padding, bias);
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
    const int stride = r.get_in_range("stride", kernel, 1, 64);
    return std::make_unique<MaxPool2D>(kernel, stride, r.get_in_range("padding", 0, 0, kernel / 2));
  }
  if (type == "batchnorm2d") {
    DPTRAIN_CHECK(input.size() == 3, "config key ", r.path_of("type"),
                  ": batchnorm2d needs a [C, H, W] input, gets ", shape_str(input));
    return std::make_unique<BatchNorm2d>(name, input[0]);
  }
  if (type == "global_avgpool") return std::make_unique<GlobalAvgPool>();
  if (type == "basic_block" || type == "bottleneck") {
    DPTRAIN_CHECK(input.size() == 3, "config key ", r.path_of("type"), ": ", type,
                  " needs a [C, H, W] input, gets ", shape_str(input));
    DPTRAIN_CHECK(r.has("planes"), "config key ", r.path_of("planes"), " is missing (", type, ")");
    const int64_t planes = r.get_in_range<int64_t>("planes", 1, 1, 1 << 16);
    const int stride = r.get_in_range("stride", 1, 1, 8);
    return residual_block(
        type == "basic_block" ? ResidualBlock::Kind::kBasic : ResidualBlock::Kind::kBottleneck, name,
        input[0], planes, stride, seed);
  }
  if (type == "relu") return std::make_unique<ActivationLayer>(Activation::kRelu);
  if (type == "tanh") return std::make_unique<ActivationLayer>(Activation::kTanh);
  if (type == "sigmoid") return std::make_unique<ActivationLayer>(Activation::kSigmoid);
  if (type == "flatten") return std::make_unique<Flatten>();
  if (type == "dropout") {
    const float p = r.get_in_range("p", 0.5f, 0.0f, 0.99f);
    return std::make_unique<Dropout>(name, p);
  }
  DPTRAIN_FAIL(
      "config key ", r.path_of("type"), " = \"", type,
      "\" is not a layer type; use dense, conv2d, maxpool2d, batchnorm2d, global_avgpool, basic_block, "
      "bottleneck, relu, tanh, sigmoid, flatten or dropout");
}

// torchvision's ResNet layout: a stem, stages of residual blocks (the first block of a stage with the
// stage's stride), global average pooling and "fc".
struct ResNetLayout {
  ResidualBlock::Kind block;
  std::vector<int> blocks_per_stage;
  std::vector<int64_t> planes;
  bool imagenet_stem;  // 7x7 stride-2 conv + 3x3 stride-2 max-pool; else a 3x3 stride-1 conv
};

ResNetLayout resnet_layout(const std::string& name) {
  using Kind = ResidualBlock::Kind;
  if (name == "resnet18") return {Kind::kBasic, {2, 2, 2, 2}, {64, 128, 256, 512}, true};
  if (name == "resnet34") return {Kind::kBasic, {3, 4, 6, 3}, {64, 128, 256, 512}, true};
  if (name == "resnet50") return {Kind::kBottleneck, {3, 4, 6, 3}, {64, 128, 256, 512}, true};
  if (name == "resnet20") return {Kind::kBasic, {3, 3, 3}, {16, 32, 64}, false};
  DPTRAIN_FAIL("config key model.architecture = \"", name,
               "\" is not an architecture; use \"resnet18\", \"resnet34\", \"resnet50\" or \"resnet20\"");
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
  // conv2d followed by relu: one kernel does both (same numbers, one pass less over the activation);
  // and by a max pooling after that, one kernel does all three (the conv output never stored).
  for (std::size_t i = 0; i + 1 < model->size(); ++i) {
    auto* conv = dynamic_cast<Conv2D*>(&model->layer(i));
    auto* act = dynamic_cast<ActivationLayer*>(&model->layer(i + 1));
    if (conv && act && act->kind() == Activation::kRelu) {
      conv->fuse_relu();
      act->mark_fused();
      auto* pool = i + 2 < model->size() ? dynamic_cast<MaxPool2D*>(&model->layer(i + 2)) : nullptr;
      if (pool) {
        conv->fuse_maxpool(pool->options());
        pool->mark_fused();
      }
    }
  }
  return model;
}

std::unique_ptr<Sequential> build_architecture(const std::string& architecture, const Shape& input_shape,
                                               int64_t num_classes, uint64_t seed) {
  const ResNetLayout layout = resnet_layout(architecture);
  DPTRAIN_CHECK(input_shape.size() == 3, "config key model.input_shape = ", shape_str(input_shape), ": ",
                architecture, " needs [C, H, W]");
  DPTRAIN_CHECK(num_classes >= 1, "config key model.num_classes must be >= 1");
  auto model = std::make_unique<Sequential>();
  const int64_t stem_channels = layout.planes.front();
  auto conv1 = layout.imagenet_stem
                   ? std::make_unique<Conv2D>("conv1", input_shape[0], stem_channels, 7, 2, 3, false)
                   : std::make_unique<Conv2D>("conv1", input_shape[0], stem_channels, 3, 1, 1, false);
  kaiming_normal_fan_out(*conv1, seed, "conv1.weight");
  model->add(std::move(conv1));
  model->add(std::make_unique<BatchNorm2d>("bn1", stem_channels));
  model->add(std::make_unique<ActivationLayer>(Activation::kRelu));
  if (layout.imagenet_stem) model->add(std::make_unique<MaxPool2D>(3, 2, 1));
  int64_t channels = stem_channels;
  for (std::size_t stage = 0; stage < layout.planes.size(); ++stage)
    for (int b = 0; b < layout.blocks_per_stage[stage]; ++b) {
      const int stride = stage > 0 && b == 0 ? 2 : 1;
      const std::string name = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      auto block = residual_block(layout.block, name, channels, layout.planes[stage], stride, seed);
      channels = block->out_channels();
      model->add(std::move(block));
    }
  model->add(std::make_unique<GlobalAvgPool>());
  auto fc = std::make_unique<Dense>("fc", channels, num_classes, true);
  const Initializer default_init{};
  initialize(fc->weight(), default_init, channels, num_classes, seed, "fc.weight");
  initialize(fc->bias(), default_init, channels, num_classes, seed, "fc.bias");
  model->add(std::move(fc));
  try {
    model->output_shape(input_shape);
  } catch (const Error& e) {
    DPTRAIN_FAIL("config key model.input_shape = ", shape_str(input_shape), " does not fit ", architecture,
                 ": ", e.what());
  }
  return model;
}

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
