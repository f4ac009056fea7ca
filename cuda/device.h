// Devices and device memory: probing (never throws: no driver and no device are answers, not
// errors), one device per rank (local_rank % device count), and a caching allocator so that a
// steady-state training step calls cudaMalloc zero times.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dptrain::cuda {

struct DeviceProbe {
  int count = 0;
  std::string reason;  // why count is 0 ("no CUDA driver", ...); empty otherwise
};
DeviceProbe probe_devices();

// cudaSetDevice(local_rank % count); returns the device. Throws when there is none.
int select_device(int local_rank);

// Device memory by exact size, kept on release and handed out again: after the first step every
// request is a hit. Not thread-safe: one per rank, used from the training thread.
class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(std::size_t bytes);
  void release(void* pointer, std::size_t bytes);
  std::size_t fresh_allocations() const { return fresh_; }  // cudaMalloc calls so far

 private:
  std::map<std::size_t, std::vector<void*>> free_;  // size -> blocks
  std::size_t fresh_ = 0;
};

// A device array of T from an allocator, element-counted.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(CachingAllocator& allocator, std::size_t count)
      : allocator_(&allocator), data_(static_cast<T*>(allocator.allocate(count * sizeof(T)))), size_(count) {}
  ~DeviceBuffer() {
    if (data_ != nullptr) allocator_->release(data_, size_ * sizeof(T));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return data_; }
  std::size_t size() const { return size_; }

  void copy_from_host(const T* host, std::size_t count);
  void copy_to_host(T* host, std::size_t count) const;

 private:
  CachingAllocator* allocator_;
  T* data_;
  std::size_t size_;
};

}  // namespace dptrain::cuda
