// FlatParameters: a model's parameters in one flat buffer and their gradients in another of the same
// layout (llm.c's params_memory / grads_memory), so that zeroing gradients, an optimizer update and a
// broadcast are each one call over one buffer, and an allreduce bucket is a contiguous range of the
// gradient buffer. Each parameter stays addressable by name as a window into the buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dptrain {

// A contiguous range of the flat buffers, in elements.
struct FlatRange {
  int64_t offset = 0;
  int64_t numel = 0;
  int64_t end() const { return offset + numel; }
  bool operator==(const FlatRange&) const = default;
};

// Memory of `bytes` bytes for a flat buffer (a communicator's, say: distributed/communicator.h).
using BufferAllocator = std::function<StoragePtr(std::size_t bytes)>;

class FlatParameters {
 public:
  // Moves `parameters` (values kept, gradients so far dropped) into flat buffers on `device`: the
  // tensors themselves now view their place there, so every holder of them (the layers) sees it.
  // Laid out in reverse order, the order backward produces gradients in, each parameter starting on
  // a 64-byte boundary (16 floats); the padding between them is zero and stays zero. The gradient
  // buffer comes from `allocate_gradients` when given (memory on `device` that the gradients' reduction
  // works in best), else from `device`'s backend; the value buffer likewise from `allocate_values`
  // (where the updated parameters are all-gathered: a sharded optimizer).
  FlatParameters(std::vector<NamedTensor> parameters, Device device,
                 const BufferAllocator& allocate_gradients = {}, const BufferAllocator& allocate_values = {});
  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  const std::vector<NamedTensor>& parameters() const { return parameters_; }  // in the given order
  Device device() const { return device_; }
  int64_t size() const { return size_; }  // elements of each flat buffer, padding included
  int64_t offset(std::size_t parameter) const {
    return offsets_.at(parameter);
  }                       // of a parameter's first element
  int64_t numel() const;  // parameter elements, padding excluded

  const Tensor& values() const { return values_; }  // [size()]
  const Tensor& grads() const { return grads_; }    // [size()]
  void zero_grad() const;

  // A new zero buffer of the same layout (an optimizer's slot), and its per-parameter windows named
  // "<parameter>.<suffix>".
  Tensor new_buffer() const;
  std::vector<NamedTensor> windows(const Tensor& buffer, const std::string& suffix) const;

 private:
  std::vector<NamedTensor> parameters_;
  Device device_;
  std::vector<int64_t> offsets_;
  int64_t size_ = 0;
  Tensor values_, grads_;
};

}  // namespace dptrain
