// Tensor: a float32, contiguous, row-major array on a device, with an optional gradient on the same
// device, shared by handle (copies of a Tensor refer to the same data). Host code reads and writes
// elements through data() and values(), which fail loudly on device memory; kernels get data_ptr();
// everything else crosses devices through an explicit copy (to(), copy_from(), to_vector()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/storage.h"

namespace dptrain {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// The state behind a Tensor handle. Its members are private: the tape and the flat parameter
// buffers reach them through core's internal TensorAccess, everyone else through Tensor.
class TensorImpl {
 private:
  friend class Tensor;
  friend class GradHook;
  friend struct TensorAccess;

  Shape shape_;
  int64_t numel_ = 0;
  StoragePtr data_;  // shared between a tensor and its reshaped views
  StoragePtr grad_;  // allocated on first use: zeroed (grad_ptr()), or written whole (GradientOut)
  bool requires_grad_ = false;
  // Leaf tensors (parameters) may ask to hear when backward has produced their final gradient.
  std::vector<std::pair<uint64_t, std::function<void()>>> grad_ready_hooks_;
  int pending_grad_uses_ = 0;  // ops recorded on the tape that still owe this tensor gradient
};

// Removes its gradient-ready hook when destroyed (or reset).
class GradHook {
 public:
  GradHook() = default;
  GradHook(std::weak_ptr<TensorImpl> tensor, uint64_t id) : tensor_(std::move(tensor)), id_(id) {}
  GradHook(GradHook&& other) noexcept { *this = std::move(other); }
  GradHook& operator=(GradHook&& other) noexcept;
  ~GradHook() { reset(); }
  void reset();

 private:
  std::weak_ptr<TensorImpl> tensor_;
  uint64_t id_ = 0;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, bool requires_grad = false);
  static Tensor empty(Shape shape, Device device);
  static Tensor zeros(Shape shape, bool requires_grad = false);
  static Tensor zeros(Shape shape, Device device);
  static Tensor full(Shape shape, float value, bool requires_grad = false);
  static Tensor from_data(Shape shape, std::span<const float> values, bool requires_grad = false);
  // A tensor on `device` holding `values`, copied once (Backend::upload: on a GPU, without waiting
  // for the work queued there).
  static Tensor from_host(Shape shape, std::span<const float> values, Device device);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape_; }
  int64_t dim(int i) const { return impl_->shape_.at(i < 0 ? impl_->shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(impl_->shape_.size()); }
  int64_t numel() const { return impl_->numel_; }
  Device device() const { return impl_->data_->device(); }

  // Host access: the elements of a tensor in host memory; throws for device memory (copy first).
  float* data() const { return host(impl_->data_->as<float>(), "data"); }
  std::span<float> values() const { return {data(), static_cast<std::size_t>(numel())}; }
  // For kernels: the elements where they live, on device().
  float* data_ptr() const { return impl_->data_->as<float>(); }
  float item() const;  // the single element, copied to the host

  bool requires_grad() const { return impl_ && impl_->requires_grad_; }
  void set_requires_grad(bool on) const { impl_->requires_grad_ = on; }
  bool has_grad() const { return impl_->grad_ != nullptr; }
  // The gradient buffer, allocated and zeroed on first use: on the host (checked) and where it lives.
  float* grad_data() const { return host(grad_ptr(), "grad_data"); }
  float* grad_ptr() const;
  std::span<float> grad() const { return {grad_data(), static_cast<std::size_t>(numel())}; }
  void zero_grad() const;

  // Calls `hook` each time backward has produced this tensor's final gradient of the pass (after its
  // last use on the tape has contributed), until the returned handle is destroyed.
  [[nodiscard]] GradHook on_grad_ready(std::function<void()> hook) const;

  // A tensor sharing this one's data with another shape (same element count).
  Tensor view(Shape shape) const;
  // A detached copy that owns its data, on the same device.
  Tensor clone() const;
  // This tensor on `device`: itself if it is there already, else a detached copy.
  Tensor to(Device device) const;
  // Copies `source`'s elements (same element count, any device) into this tensor.
  void copy_from(const Tensor& source) const;
  // The elements, copied to the host.
  std::vector<float> to_vector() const;

  // Runs reverse-mode autodiff from this scalar through the tape recorded since the last backward,
  // seeding d(this)/d(this) = seed (e.g. 1/k to average k accumulated passes).
  void backward(float seed = 1.0f) const;

  bool same_as(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  friend struct TensorAccess;
  static Tensor over(Shape shape, StoragePtr data);  // a tensor of `shape` on `data`
  float* host(float* p, const char* what) const {
    if (!impl_->data_->device().is_host()) [[unlikely]]
      fail_not_host(what);
    return p;
  }
  [[noreturn]] void fail_not_host(const char* what) const;

  std::shared_ptr<TensorImpl> impl_;
};

// How a tensor is stored in files: float32, or int64 for the counters PyTorch keeps as integers
// (BatchNorm's num_batches_tracked), so state dicts load with strict=True both ways.
enum class StoredType { kF32, kI64 };

// A tensor with the name it is known by outside the process (checkpoints, PyTorch, logs).
struct NamedTensor {
  std::string name;
  Tensor tensor;
  StoredType stored = StoredType::kF32;
};

}  // namespace dptrain
