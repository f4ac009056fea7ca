// Device probing, selection and the caching allocator.
#include "cuda/device.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/check.h"

namespace dptrain::cuda {

DeviceProbe probe_devices() {
  DeviceProbe probe;
  const cudaError_t status = cudaGetDeviceCount(&probe.count);
  if (status != cudaSuccess) {
    probe.count = 0;
    probe.reason = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
  } else if (probe.count == 0) {
    probe.reason = "the CUDA driver reports no device";
  }
  return probe;
}

int select_device(int local_rank) {
  const DeviceProbe probe = probe_devices();
  DPTRAIN_CHECK(probe.count > 0, "no CUDA device for local rank ", local_rank, ": ", probe.reason,
                "; run on a GPU machine or set device to \"cpu\"");
  const int device = local_rank % probe.count;
  DPTRAIN_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

CachingAllocator::~CachingAllocator() {
  for (auto& [bytes, blocks] : free_)
    for (void* p : blocks) cudaFree(p);  // at exit: nothing useful to do with an error here
}

void* CachingAllocator::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  auto it = free_.find(bytes);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  void* p = nullptr;
  DPTRAIN_CUDA_CHECK(cudaMalloc(&p, bytes));
  ++fresh_;
  return p;
}

void CachingAllocator::release(void* pointer, std::size_t bytes) {
  if (pointer != nullptr) free_[bytes].push_back(pointer);
}

template <typename T>
void DeviceBuffer<T>::copy_from_host(const T* host, std::size_t count) {
  DPTRAIN_CHECK(count <= size_, "copy of ", count, " elements into a device buffer of ", size_);
  DPTRAIN_CUDA_CHECK(cudaMemcpy(data_, host, count * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
void DeviceBuffer<T>::copy_to_host(T* host, std::size_t count) const {
  DPTRAIN_CHECK(count <= size_, "copy of ", count, " elements out of a device buffer of ", size_);
  DPTRAIN_CUDA_CHECK(cudaMemcpy(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost));
}

template class DeviceBuffer<float>;
template class DeviceBuffer<uint16_t>;

}  // namespace dptrain::cuda
