// Tensor construction, views, device copies, gradient buffers and gradient-ready hooks.
#include "core/tensor.h"

#include <algorithm>
#include <atomic>

#include "core/backend.h"
#include "core/error.h"

namespace dptrain {
namespace {

std::atomic<uint64_t> next_hook_id{1};

std::size_t bytes_of(int64_t numel) {
  return static_cast<std::size_t>(numel) * sizeof(float);
}

}  // namespace

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

GradHook& GradHook::operator=(GradHook&& other) noexcept {
  if (this != &other) {
    reset();
    tensor_ = std::move(other.tensor_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void GradHook::reset() {
  if (const std::shared_ptr<TensorImpl> impl = tensor_.lock()) {
    auto& hooks = impl->grad_ready_hooks_;
    std::erase_if(hooks, [&](const auto& entry) { return entry.first == id_; });
  }
  tensor_.reset();
}

Tensor Tensor::over(Shape shape, StoragePtr data) {
  Tensor t;
  t.impl_ = std::make_shared<TensorImpl>();
  t.impl_->numel_ = shape_numel(shape);
  t.impl_->shape_ = std::move(shape);
  t.impl_->data_ = std::move(data);
  return t;
}

Tensor Tensor::empty(Shape shape, Device device) {
  const int64_t n = shape_numel(shape);
  return over(std::move(shape), make_storage(bytes_of(n), device));
}

Tensor Tensor::empty(Shape shape, bool requires_grad) {
  Tensor t = empty(std::move(shape), Device::cpu());
  t.impl_->requires_grad_ = requires_grad;
  return t;
}

Tensor Tensor::zeros(Shape shape, Device device) {
  Tensor t = empty(std::move(shape), device);
  backend_for(device).fill(t.data_ptr(), t.numel(), 0.0f);
  return t;
}

Tensor Tensor::zeros(Shape shape, bool requires_grad) {
  return full(std::move(shape), 0.0f, requires_grad);
}

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

Tensor Tensor::from_host(Shape shape, std::span<const float> values, Device device) {
  const int64_t n = shape_numel(shape);
  DPTRAIN_CHECK(static_cast<int64_t>(values.size()) == n, "from_host: ", values.size(), " values for shape ",
                shape_str(shape));
  return over(std::move(shape), std::make_shared<Storage>(device, values.data(), bytes_of(n)));
}

void Tensor::fail_not_host(const char* what) const {
  DPTRAIN_FAIL(what, "() on a tensor of shape ", shape_str(shape()), " in ", device().str(),
               " memory; copy it to the host first (to(Device::cpu()), to_vector(), item())");
}

float Tensor::item() const {
  DPTRAIN_CHECK(numel() == 1, "item() needs a single-element tensor, got shape ", shape_str(shape()));
  float value;
  backend_for(device()).copy_to_host(&value, data_ptr(), sizeof value);
  return value;
}

float* Tensor::grad_ptr() const {
  if (!impl_->grad_) {
    impl_->grad_ = make_storage(bytes_of(numel()), device());
    backend_for(device()).fill(impl_->grad_->as<float>(), numel(), 0.0f);
  }
  return impl_->grad_->as<float>();
}

void Tensor::zero_grad() const {
  if (impl_->grad_) backend_for(device()).fill(impl_->grad_->as<float>(), numel(), 0.0f);
}

GradHook Tensor::on_grad_ready(std::function<void()> hook) const {
  const uint64_t id = next_hook_id.fetch_add(1, std::memory_order_relaxed);
  impl_->grad_ready_hooks_.emplace_back(id, std::move(hook));
  return GradHook(impl_, id);
}

Tensor Tensor::view(Shape shape) const {
  DPTRAIN_CHECK(shape_numel(shape) == numel(), "view: cannot view ", shape_str(this->shape()), " as ",
                shape_str(shape));
  Tensor t;
  t.impl_ = std::make_shared<TensorImpl>();
  t.impl_->numel_ = numel();
  t.impl_->shape_ = std::move(shape);
  t.impl_->data_ = impl_->data_;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), device());
  backend_for(device()).copy(t.data_ptr(), data_ptr(), bytes_of(numel()));
  return t;
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  Tensor t = empty(shape(), target);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& source) const {
  DPTRAIN_CHECK(source.numel() == numel(), "copy_from: ", shape_str(source.shape()), " into ",
                shape_str(shape()));
  const std::size_t bytes = bytes_of(numel());
  const Device from = source.device(), to = device();
  if (from == to) {
    backend_for(to).copy(data_ptr(), source.data_ptr(), bytes);
  } else if (from.is_host()) {
    backend_for(to).copy_from_host(data_ptr(), source.data_ptr(), bytes);
  } else if (to.is_host()) {
    backend_for(from).copy_to_host(data_ptr(), source.data_ptr(), bytes);
  } else {  // between two devices: through the host
    std::vector<float> staging(static_cast<std::size_t>(numel()));
    backend_for(from).copy_to_host(staging.data(), source.data_ptr(), bytes);
    backend_for(to).copy_from_host(data_ptr(), staging.data(), bytes);
  }
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<std::size_t>(numel()));
  backend_for(device()).copy_to_host(out.data(), data_ptr(), bytes_of(numel()));
  return out;
}

}  // namespace dptrain
