// Tensor construction, views and gradient buffers.
#include "core/tensor.h"

#include <algorithm>
#include <cstring>

#include "core/autograd.h"
#include "core/error.h"

namespace dptrain {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DPTRAIN_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
    n *= d;
  }
  return n;
}

Tensor Tensor::empty(Shape shape, bool requires_grad) {
  Tensor t;
  t.impl_ = std::make_shared<TensorImpl>();
  t.impl_->numel = shape_numel(shape);
  t.impl_->shape = std::move(shape);
  t.impl_->data = make_storage(static_cast<std::size_t>(t.impl_->numel) * sizeof(float));
  t.impl_->requires_grad = requires_grad;
  return t;
}

Tensor Tensor::zeros(Shape shape, bool requires_grad) { return full(std::move(shape), 0.0f, requires_grad); }

Tensor Tensor::full(Shape shape, float value, bool requires_grad) {
  Tensor t = empty(std::move(shape), requires_grad);
  std::fill_n(t.data(), t.numel(), value);
  return t;
}

Tensor Tensor::from_data(Shape shape, std::span<const float> values, bool requires_grad) {
  Tensor t = empty(std::move(shape), requires_grad);
  DPTRAIN_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_data: ", values.size(),
                " values for shape ", shape_str(t.shape()));
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

float Tensor::item() const {
  DPTRAIN_CHECK(numel() == 1, "item() needs a single-element tensor, got shape ", shape_str(shape()));
  return data()[0];
}

float* Tensor::grad_data() const {
  if (!impl_->grad) {
    impl_->grad = make_storage(static_cast<std::size_t>(numel()) * sizeof(float));
    std::memset(impl_->grad->data(), 0, static_cast<std::size_t>(numel()) * sizeof(float));
  }
  return impl_->grad->as<float>();
}

void Tensor::zero_grad() const {
  if (impl_->grad) std::memset(impl_->grad->data(), 0, static_cast<std::size_t>(numel()) * sizeof(float));
}

void Tensor::bind_grad(StoragePtr storage) const {
  DPTRAIN_CHECK(storage->bytes() >= static_cast<std::size_t>(numel()) * sizeof(float), "bind_grad: buffer of ",
                storage->bytes(), " bytes for ", numel(), " floats");
  if (impl_->grad)
    std::memcpy(storage->data(), impl_->grad->data(), static_cast<std::size_t>(numel()) * sizeof(float));
  else
    std::memset(storage->data(), 0, static_cast<std::size_t>(numel()) * sizeof(float));
  impl_->grad = std::move(storage);
}

Tensor Tensor::view(Shape shape) const {
  DPTRAIN_CHECK(shape_numel(shape) == numel(), "view: cannot view ", shape_str(this->shape()), " as ",
                shape_str(shape));
  Tensor t;
  t.impl_ = std::make_shared<TensorImpl>();
  t.impl_->numel = numel();
  t.impl_->shape = std::move(shape);
  t.impl_->data = impl_->data;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape());
  std::copy_n(data(), numel(), t.data());
  return t;
}

void Tensor::backward(float seed) const { autograd::backward(*this, seed); }

}  // namespace dptrain
