// Dense: PyTorch's nn.Linear, weight [out, in] and bias [out].
#pragma once

#include <string>

#include "layers/module_base.h"

namespace dptrain::layers {

class Dense : public Module {
 public:
  Dense(std::string name, int64_t in_features, int64_t out_features, bool bias);
  Tensor forward(const Tensor& x) override { return ops::linear(x, weight_, bias_); }
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& /*input*/) const override { return weight_.numel(); }
  std::vector<NamedTensor> named_parameters() const override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::string name_;
  Tensor weight_, bias_;  // [out, in], [out] (bias undefined when disabled)
};

}  // namespace dptrain::layers
