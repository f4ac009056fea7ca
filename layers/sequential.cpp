// Sequential: forward, shapes and multiply-adds chained through the layers.
#include "layers/sequential.h"

namespace dptrain::layers {

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& layer : children()) h = layer->forward(h);
  return h;
}

Shape Sequential::output_shape(const Shape& input) const {
  Shape s = input;
  for (const auto& layer : children()) s = layer->output_shape(s);
  return s;
}

int64_t Sequential::multiply_adds(const Shape& input) const {
  int64_t total = 0;
  Shape s = input;
  for (const auto& layer : children()) {
    total += layer->multiply_adds(s);
    s = layer->output_shape(s);
  }
  return total;
}

std::string Sequential::describe() const {
  std::string s;
  for (std::size_t i = 0; i < children().size(); ++i)
    s += "  " + std::to_string(i) + ": " + children()[i]->describe() + "\n";
  return s;
}

}  // namespace dptrain::layers
