// The layers that shrink or flatten the spatial dimensions: MaxPool2D, GlobalAvgPool and Flatten.
#pragma once

#include <string>

#include "layers/module_base.h"

namespace dptrain::layers {

class MaxPool2D : public Module {
 public:
  MaxPool2D(int kernel, int stride, int padding = 0) : kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override {
    return fused_ ? x : ops::maxpool2d(x, kernel_, stride_, padding_);
  }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  ops::MaxPool2dOptions options() const { return {kernel_, stride_, padding_}; }
  // The convolution before applies this pooling itself; forward passes its input through.
  void mark_fused() { fused_ = true; }

 private:
  int kernel_, stride_, padding_;
  bool fused_ = false;
};

// [C, H, W] -> [C]: the mean of each channel (AdaptiveAvgPool2d(1) followed by flatten).
class GlobalAvgPool : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::global_avgpool(x); }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override { return "GlobalAvgPool"; }
};

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::flatten(x); }
  Shape output_shape(const Shape& input) const override { return {shape_numel(input)}; }
  std::string describe() const override { return "Flatten"; }
};

}  // namespace dptrain::layers
