// Conv2D and its layer type "conv2d".
#include "layers/conv.h"

#include "core/error.h"
#include "layers/init.h"
#include "layers/registry.h"

namespace dptrain::layers {

Conv2D::Conv2D(std::string name, int64_t in_channels, int64_t out_channels, int kernel, int stride,
               int padding, bool bias)
    : name_(std::move(name)),
      kernel_(kernel),
      stride_(stride),
      padding_(padding),
      weight_(Tensor::zeros({out_channels, in_channels, kernel, kernel}, true)) {
  if (bias) bias_ = Tensor::zeros({out_channels}, true);
}

Shape Conv2D::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3 && input[0] == weight_.dim(1), "layer ", name_, " (conv2d): expects [",
                weight_.dim(1), ", H, W] per sample, gets ", shape_str(input));
  const int64_t h = (input[1] + 2 * padding_ - kernel_) / stride_ + 1;
  const int64_t w = (input[2] + 2 * padding_ - kernel_) / stride_ + 1;
  DPTRAIN_CHECK(h > 0 && w > 0, "layer ", name_, " (conv2d): kernel ", kernel_, " does not fit input ",
                shape_str(input));
  return {weight_.dim(0), h, w};
}

int64_t Conv2D::multiply_adds(const Shape& input) const {
  return shape_numel(output_shape(input)) * (weight_.numel() / weight_.dim(0));
}

std::vector<NamedTensor> Conv2D::named_parameters() const {
  return weight_and_bias(name_, weight_, bias_);
}

std::string Conv2D::describe() const {
  return "Conv2D(" + std::to_string(weight_.dim(1)) + " -> " + std::to_string(weight_.dim(0)) + ", " +
         std::to_string(kernel_) + "x" + std::to_string(kernel_) + ", stride " + std::to_string(stride_) +
         ", padding " + std::to_string(padding_) + ")";
}

namespace {
std::unique_ptr<Module> build_conv2d(const LayerContext& c) {
  ObjectReader& r = c.config;
  DPTRAIN_CHECK(c.input.size() == 3, "config key ", r.path_of("type"),
                ": conv2d needs a [C, H, W] input, gets ", shape_str(c.input));
  DPTRAIN_CHECK(r.has("out_channels") && r.has("kernel"), "config key ", r.path_of("type"),
                ": conv2d needs out_channels and kernel");
  const int64_t out = r.get_in_range<int64_t>("out_channels", 1, 1, 1 << 16);
  const int kernel = r.get_in_range("kernel", 1, 1, 64);
  const int stride = r.get_in_range("stride", 1, 1, 64);
  const int padding = r.get_in_range("padding", 0, 0, 64);
  const bool bias = r.get<bool>("bias", true);
  auto layer = std::make_unique<Conv2D>(c.name, c.input[0], out, kernel, stride, padding, bias);
  initialize_weight_and_bias(r, layer->weight(), layer->bias(), c.input[0] * kernel * kernel,
                             out * kernel * kernel, c.seed, c.name);
  return layer;
}
}  // namespace

extern const LayerType kConv2dLayer{"conv2d", build_conv2d};

}  // namespace dptrain::layers
