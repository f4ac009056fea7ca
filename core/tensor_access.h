// TensorAccess: core-internal access to TensorImpl's members for the tape (autograd.cpp) and the flat
// parameter buffers (parameters.cpp). Never included outside core/.
#pragma once

#include <memory>

#include "core/tensor.h"

namespace dptrain {

struct TensorAccess {
  static TensorImpl& impl(const Tensor& t) { return *t.impl_; }
  static std::shared_ptr<TensorImpl> shared(const Tensor& t) { return t.impl_; }
  // A tensor of `shape` over `data` (e.g. a window into a flat buffer).
  static Tensor wrap(Shape shape, StoragePtr data) { return Tensor::over(std::move(shape), std::move(data)); }
  static StoragePtr& data(TensorImpl& impl) { return impl.data_; }
  static StoragePtr& grad(TensorImpl& impl) { return impl.grad_; }
  static bool has_grad_ready_hooks(const TensorImpl& impl) { return !impl.grad_ready_hooks_.empty(); }
  static int& pending_grad_uses(TensorImpl& impl) { return impl.pending_grad_uses_; }
  static void run_grad_ready_hooks(TensorImpl& impl) {
    for (auto& [id, hook] : impl.grad_ready_hooks_) hook();
  }
};

}  // namespace dptrain
