// Parameter initialisers: the config's "weight_init" / "bias_init" choices and torchvision's ResNet
// convolution initialisation. Each tensor draws from its own stream, derive_seed(seed, its name).
#pragma once

#include <cstdint>
#include <string>

#include "core/config_reader.h"
#include "core/tensor.h"

namespace dptrain::layers {

// "default" (PyTorch's: kaiming_uniform with a = sqrt(5) for weights, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for biases), "kaiming_uniform" (He, for
// ReLU: U(-sqrt(6/fan_in), +)), "glorot_uniform" (U(-sqrt(6/(fan_in+fan_out)), +)), "zeros", "ones",
// or a number (constant).
struct Initializer {
  enum class Kind { kDefault, kKaimingUniform, kGlorotUniform, kConstant } kind = Kind::kDefault;
  float value = 0.0f;
};

// The initialiser under `key` (default when absent); biases take no fan-based scheme but the default.
Initializer parse_initializer(ObjectReader& reader, const std::string& key, bool for_bias);

void initialize(const Tensor& t, const Initializer& init, int64_t fan_in, int64_t fan_out, uint64_t seed,
                const std::string& name);

// A layer's "weight_init" and "bias_init" keys (both read, so both are checked) applied to
// `<name>.weight` and, when the layer has one, `<name>.bias`.
void initialize_weight_and_bias(ObjectReader& reader, const Tensor& weight, const Tensor& bias,
                                int64_t fan_in, int64_t fan_out, uint64_t seed, const std::string& name);

// torchvision's ResNet initialisation of a convolution weight [O, C, KH, KW]:
// kaiming_normal_(mode="fan_out", nonlinearity="relu"), i.e. N(0, 2 / (O * KH * KW)).
void kaiming_normal_fan_out(const Tensor& weight, uint64_t seed, const std::string& name);

}  // namespace dptrain::layers
