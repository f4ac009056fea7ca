// MaxPool2D, GlobalAvgPool and Flatten, and their layer types "maxpool2d", "global_avgpool" and
// "flatten".
#include "layers/pooling.h"

#include "core/error.h"
#include "layers/registry.h"

namespace dptrain::layers {

Shape MaxPool2D::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(2 * padding_ <= kernel_, "maxpool2d: padding ", padding_, " must be at most half the kernel ",
                kernel_);
  DPTRAIN_CHECK(input.size() == 3 && input[1] + 2 * padding_ >= kernel_ && input[2] + 2 * padding_ >= kernel_,
                "maxpool2d: kernel ", kernel_, " does not fit per-sample input ", shape_str(input));
  return {input[0], (input[1] + 2 * padding_ - kernel_) / stride_ + 1,
          (input[2] + 2 * padding_ - kernel_) / stride_ + 1};
}

std::string MaxPool2D::describe() const {
  return "MaxPool2D(" + std::to_string(kernel_) + ", stride " + std::to_string(stride_) +
         (padding_ ? ", padding " + std::to_string(padding_) : "") + ")" +
         (fused_ ? " (fused into the convolution before)" : "");
}

Shape GlobalAvgPool::output_shape(const Shape& input) const {
  DPTRAIN_CHECK(input.size() == 3, "global_avgpool: expects [C, H, W] per sample, gets ", shape_str(input));
  return {input[0]};
}

namespace {
std::unique_ptr<Module> build_maxpool2d(const LayerContext& c) {
  ObjectReader& r = c.config;
  DPTRAIN_CHECK(r.has("kernel"), r.missing("kernel", " (maxpool2d)"));
  const int kernel = r.get_in_range("kernel", 2, 1, 64);
  const int stride = r.get_in_range("stride", kernel, 1, 64);
  return std::make_unique<MaxPool2D>(kernel, stride, r.get_in_range("padding", 0, 0, kernel / 2));
}
}  // namespace

extern const LayerType kMaxPool2dLayer{"maxpool2d", build_maxpool2d};
extern const LayerType kGlobalAvgPoolLayer{"global_avgpool", build_keyless<GlobalAvgPool>};
extern const LayerType kFlattenLayer{"flatten", build_keyless<Flatten>};

}  // namespace dptrain::layers
