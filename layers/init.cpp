// Parameter initialisers.
#include "layers/init.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace dptrain::layers {

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

void initialize_weight_and_bias(ObjectReader& reader, const Tensor& weight, const Tensor& bias,
                                int64_t fan_in, int64_t fan_out, uint64_t seed, const std::string& name) {
  const Initializer w = parse_initializer(reader, "weight_init", false),
                    b = parse_initializer(reader, "bias_init", true);
  initialize(weight, w, fan_in, fan_out, seed, name + ".weight");
  if (bias.defined()) initialize(bias, b, fan_in, fan_out, seed, name + ".bias");
}

void kaiming_normal_fan_out(const Tensor& weight, uint64_t seed, const std::string& name) {
  const double stddev = std::sqrt(2.0 / static_cast<double>(weight.dim(0) * weight.dim(2) * weight.dim(3)));
  Rng rng(derive_seed(seed, name));
  for (float& v : weight.values()) v = static_cast<float>(stddev * rng.normal());
}

}  // namespace dptrain::layers
