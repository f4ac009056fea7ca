// Flat parameter and gradient buffers, and the windows the parameters become.
#include "core/parameters.h"

#include "core/backend.h"
#include "core/error.h"
#include "core/tensor_access.h"

namespace dptrain {
namespace {

constexpr int64_t kAlignFloats = 16;  // 64 bytes: the kernels' Eigen maps expect aligned buffers
int64_t aligned(int64_t n) {
  return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

StoragePtr window(const Tensor& flat, int64_t offset, int64_t numel) {
  return std::make_shared<Storage>(TensorAccess::data(TensorAccess::impl(flat)), sizeof(float) * offset,
                                   sizeof(float) * numel);
}

}  // namespace

FlatParameters::FlatParameters(std::vector<NamedTensor> parameters, Device device,
                               const BufferAllocator& allocate_gradients,
                               const BufferAllocator& allocate_values)
    : parameters_(std::move(parameters)), device_(device), offsets_(parameters_.size()) {
  for (std::size_t k = parameters_.size(); k-- > 0;) {
    DPTRAIN_CHECK(parameters_[k].tensor.defined(), "parameter '", parameters_[k].name, "' is undefined");
    offsets_[k] = size_;
    size_ += aligned(parameters_[k].tensor.numel());
  }
  // Zeroed, whichever memory it is: the padding between parameters stays zero.
  const auto flat_buffer = [&](const BufferAllocator& allocate, const char* what) {
    if (!allocate) return Tensor::zeros({size_}, device_);
    StoragePtr memory = allocate(sizeof(float) * static_cast<std::size_t>(size_));
    DPTRAIN_CHECK(memory && memory->bytes() >= sizeof(float) * static_cast<std::size_t>(size_) &&
                      memory->device() == device_,
                  "FlatParameters: the ", what, " allocator returned no buffer of ", size_, " floats on ",
                  device_.str());
    Tensor buffer = TensorAccess::wrap({size_}, std::move(memory));
    backend_for(device_).fill(buffer.data_ptr(), size_, 0.0f);
    return buffer;
  };
  values_ = flat_buffer(allocate_values, "value");
  grads_ = flat_buffer(allocate_gradients, "gradient");
  for (std::size_t k = 0; k < parameters_.size(); ++k) {
    const Tensor& p = parameters_[k].tensor;
    StoragePtr values_window = window(values_, offsets_[k], p.numel());
    // Copy the current values into their place, then make the tensor view it.
    Tensor staged = p.clone();
    TensorImpl& impl = TensorAccess::impl(p);
    TensorAccess::data(impl) = std::move(values_window);
    p.copy_from(staged);
    TensorAccess::grad(impl) = window(grads_, offsets_[k], p.numel());
  }
}

int64_t FlatParameters::numel() const {
  int64_t n = 0;
  for (const NamedTensor& p : parameters_) n += p.tensor.numel();
  return n;
}

void FlatParameters::zero_grad() const {
  backend_for(device_).fill(grads_.data_ptr(), size_, 0.0f);
}

Tensor FlatParameters::new_buffer() const {
  return Tensor::zeros({size_}, device_);
}

std::vector<NamedTensor> FlatParameters::windows(const Tensor& buffer, const std::string& suffix) const {
  DPTRAIN_CHECK(buffer.numel() == size_ && buffer.device() == device_,
                "FlatParameters::windows: a buffer of ", buffer.numel(), " elements on ",
                buffer.device().str(), " for a layout of ", size_, " on ", device_.str());
  std::vector<NamedTensor> out;
  for (std::size_t k = 0; k < parameters_.size(); ++k) {
    const Tensor& p = parameters_[k].tensor;
    out.push_back({parameters_[k].name + "." + suffix,
                   TensorAccess::wrap(p.shape(), window(buffer, offsets_[k], p.numel()))});
  }
  return out;
}

}  // namespace dptrain
