// BatchNorm, BatchNorm2d and the layer type "batchnorm2d".
#include "layers/batchnorm.h"

#include "core/backend.h"
#include "core/error.h"
#include "layers/registry.h"

namespace dptrain::layers {

BatchNorm::BatchNorm(std::string name, int64_t channels)
    : name_(std::move(name)),
      weight_(Tensor::full({channels}, 1.0f, true)),
      bias_(Tensor::zeros({channels}, true)),
      running_mean_(Tensor::zeros({channels})),
      running_var_(Tensor::full({channels}, 1.0f)),
      num_batches_tracked_(Tensor::zeros({})) {}

Tensor BatchNorm::forward(const Tensor& x) {
  return forward(x, Tensor(), fused_relu_);
}

Tensor BatchNorm::forward(const Tensor& x, const Tensor& residual, bool relu) {
  if (training())
    backend_for(num_batches_tracked_.device()).add_scalar(num_batches_tracked_.data_ptr(), 1, 1.0f);
  return ops::batch_norm(x, weight_, bias_, running_mean_, running_var_,
                         {.training = training(),
                          .momentum = 0.1f,
                          .eps = 1e-5f,
                          .sync = sync_,
                          .residual = residual,
                          .relu = relu});
}

std::vector<NamedTensor> BatchNorm::named_parameters() const {
  return weight_and_bias(name_, weight_, bias_);
}

std::vector<NamedTensor> BatchNorm::named_buffers() const {
  return {{name_ + ".running_mean", running_mean_},
          {name_ + ".running_var", running_var_},
          {name_ + ".num_batches_tracked", num_batches_tracked_, StoredType::kI64}};
}

std::string BatchNorm::describe_as(const std::string& type) const {
  return type + "(" + std::to_string(channels()) + (sync_ ? ", synchronised across ranks" : "") + ")";
}

Shape BatchNorm2d::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3 && input[0] == channels(), "layer ", name(), " (batchnorm2d): expects [",
                channels(), ", H, W] per sample, gets ", shape_str(input));
  return input;
}

namespace {
std::unique_ptr<Module> build_batchnorm2d(const LayerContext& c) {
  DPTRAIN_CHECK(c.input.size() == 3, "config key ", c.config.path_of("type"),
                ": batchnorm2d needs a [C, H, W] input, gets ", shape_str(c.input));
  return std::make_unique<BatchNorm2d>(c.name, c.input[0]);
}
}  // namespace

extern const LayerType kBatchNorm2dLayer{"batchnorm2d", build_batchnorm2d};

}  // namespace dptrain::layers
