// Sequential: layers applied one after another, named by their index as in PyTorch's nn.Sequential.
#pragma once

#include <memory>
#include <string>

#include "layers/module_base.h"

namespace dptrain::layers {

class Sequential : public Container {
 public:
  void add(std::unique_ptr<Module> layer) { add_child(std::move(layer)); }
  Tensor forward(const Tensor& x) override;
  Shape output_shape(const Shape& input) const override;
  int64_t multiply_adds(const Shape& input) const override;
  // One line per layer: "  <index>: <its description>".
  std::string describe() const override;

  std::size_t size() const { return children().size(); }
  Module& layer(std::size_t i) { return *children().at(i); }
};

}  // namespace dptrain::layers
