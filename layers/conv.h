// Conv2D: PyTorch's nn.Conv2d (square kernel, one stride and padding), weight [O, C, K, K] and bias
// [O], with the ReLU and max pooling after it optionally done inside its kernel.
#pragma once

#include <optional>
#include <string>

#include "layers/module_base.h"

namespace dptrain::layers {

class Conv2D : public Module {
 public:
  Conv2D(std::string name, int64_t in_channels, int64_t out_channels, int kernel, int stride, int padding,
         bool bias);
  Tensor forward(const Tensor& x) override {
    if (fused_pool_)
      return ops::conv2d_relu_maxpool(x, weight_, bias_, {stride_, padding_, true}, *fused_pool_);
    return ops::conv2d(x, weight_, bias_, {stride_, padding_, fuse_relu_});
  }
  // Applies the following ReLU inside the convolution (see Conv2dOptions::fuse_relu).
  void fuse_relu() { fuse_relu_ = true; }
  // After fuse_relu: applies the max pooling that follows the ReLU too (ops::conv2d_relu_maxpool).
  // output_shape still describes the convolution's output (and the fused MaxPool2D's the pooled
  // one), so shapes and multiply-adds chain through the layers as without fusion.
  void fuse_maxpool(ops::MaxPool2dOptions pool) { fused_pool_ = pool; }
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& input) const override;
  std::vector<NamedTensor> named_parameters() const override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::string name_;
  int kernel_, stride_, padding_;
  bool fuse_relu_ = false;
  std::optional<ops::MaxPool2dOptions> fused_pool_;
  Tensor weight_, bias_;  // [out_c, in_c, k, k], [out_c]
};

}  // namespace dptrain::layers
