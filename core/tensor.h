// Tensor: a float32, contiguous, row-major array on the host with an optional gradient,
// shared by handle (copies of a Tensor refer to the same data).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/storage.h"

namespace dptrain {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

struct TensorImpl {
  Shape shape;
  int64_t numel = 0;
  StoragePtr data;  // shared between a tensor and its reshaped views
  StoragePtr grad;  // allocated (zeroed) on first accumulation
  bool requires_grad = false;
  // Leaf tensors (parameters) may ask to hear when backward has produced their final gradient:
  // the distributed reducer starts a bucket's allreduce from here while backward continues.
  std::function<void()> on_grad_ready;
  int pending_grad_uses = 0;  // ops recorded on the tape that still owe this tensor gradient
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, bool requires_grad = false);
  static Tensor zeros(Shape shape, bool requires_grad = false);
  static Tensor full(Shape shape, float value, bool requires_grad = false);
  static Tensor from_data(Shape shape, std::span<const float> values, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int64_t dim(int i) const { return impl_->shape.at(i < 0 ? impl_->shape.size() + i : i); }
  int ndim() const { return static_cast<int>(impl_->shape.size()); }
  int64_t numel() const { return impl_->numel; }

  float* data() const { return impl_->data->as<float>(); }
  std::span<float> values() const { return {data(), static_cast<std::size_t>(numel())}; }
  float item() const;

  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  void set_requires_grad(bool on) const { impl_->requires_grad = on; }
  bool has_grad() const { return impl_->grad != nullptr; }
  // The gradient buffer, allocated and zeroed on first use.
  float* grad_data() const;
  std::span<float> grad() const { return {grad_data(), static_cast<std::size_t>(numel())}; }
  void zero_grad() const;
  // Makes `storage` (numel floats) this tensor's gradient buffer, keeping the current gradient values:
  // the reducer places gradients inside its communication buckets this way.
  void bind_grad(StoragePtr storage) const;

  // A tensor sharing this one's data with another shape (same element count).
  Tensor view(Shape shape) const;
  // A detached copy that owns its data.
  Tensor clone() const;

  // Runs reverse-mode autodiff from this scalar through the tape recorded since the last backward,
  // seeding d(this)/d(this) = seed (e.g. 1/k to average k accumulated passes).
  void backward(float seed = 1.0f) const;

  TensorImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// A tensor with the name it is known by outside the process (checkpoints, PyTorch, logs).
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

}  // namespace dptrain
