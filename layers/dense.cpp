// Dense and its layer type "dense".
#include "layers/dense.h"

#include "core/error.h"
#include "layers/init.h"
#include "layers/registry.h"

namespace dptrain::layers {

Dense::Dense(std::string name, int64_t in_features, int64_t out_features, bool bias)
    : name_(std::move(name)), weight_(Tensor::zeros({out_features, in_features}, true)) {
  if (bias) bias_ = Tensor::zeros({out_features}, true);
}

Shape Dense::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 1 && input[0] == weight_.dim(1), "layer ", name_, " (dense): expects ",
                weight_.dim(1), " input features, gets per-sample shape ", shape_str(input),
                input.size() > 1 ? "; add a {\"type\": \"flatten\"} layer before it" : "");
  return {weight_.dim(0)};
}

std::vector<NamedTensor> Dense::named_parameters() const {
  return weight_and_bias(name_, weight_, bias_);
}

std::string Dense::describe() const {
  return "Dense(" + std::to_string(weight_.dim(1)) + " -> " + std::to_string(weight_.dim(0)) +
         (bias_.defined() ? "" : ", no bias") + ")";
}

namespace {
std::unique_ptr<Module> build_dense(const LayerContext& c) {
  ObjectReader& r = c.config;
  DPTRAIN_CHECK(c.input.size() == 1, "config key ", r.path_of("type"),
                ": dense needs a flat input, gets per-sample ", "shape ", shape_str(c.input),
                "; add a {\"type\": \"flatten\"} layer before it");
  DPTRAIN_CHECK(r.has("out_features"), r.missing("out_features", " (dense)"));
  const int64_t in = c.input[0], out = r.get_in_range<int64_t>("out_features", 1, 1, 1 << 24);
  const bool bias = r.get<bool>("bias", true);
  auto layer = std::make_unique<Dense>(c.name, in, out, bias);
  initialize_weight_and_bias(r, layer->weight(), layer->bias(), in, out, c.seed, c.name);
  return layer;
}
}  // namespace

extern const LayerType kDenseLayer{"dense", build_dense};

}  // namespace dptrain::layers
