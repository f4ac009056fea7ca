// BatchNorm1d, PyTorch's nn.BatchNorm1d, as the layer type "batchnorm1d": per sample [C] (after a
// dense layer) or [C, L], statistics per channel over the batch (and L). Tensor names as PyTorch's:
// "<i>.weight", "<i>.running_mean", "<i>.num_batches_tracked", ...
#include "core/error.h"
#include "layers/batchnorm.h"
#include "layers/registry.h"

namespace dptrain::layers {
namespace {

class BatchNorm1d : public BatchNorm {
 public:
  BatchNorm1d(std::string name, int64_t channels) : BatchNorm(std::move(name), channels) {}
  Shape output_shape(const Shape& input) const override {
    DPTRAIN_CHECK((input.size() == 1 || input.size() == 2) && input[0] == channels(), "layer ", name(),
                  " (batchnorm1d): expects [", channels(), "] or [", channels(), ", L] per sample, gets ",
                  shape_str(input));
    return input;
  }
  std::string describe() const override { return describe_as("BatchNorm1d"); }
};

std::unique_ptr<Module> build_batchnorm1d(const LayerContext& c) {
  DPTRAIN_CHECK(c.input.size() == 1 || c.input.size() == 2, "config key ", c.config.path_of("type"),
                ": batchnorm1d needs a [C] or [C, L] input, gets ", shape_str(c.input),
                c.input.size() == 3 ? "; use batchnorm2d for [C, H, W]" : "");
  return std::make_unique<BatchNorm1d>(c.name, c.input[0]);
}

}  // namespace

extern const LayerType kBatchNorm1dLayer{"batchnorm1d", build_batchnorm1d};

}  // namespace dptrain::layers
