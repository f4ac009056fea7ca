// Storage: a buffer on a device, allocated and released through that device's backend, a window
// into another storage (a parameter inside a flat buffer, a gradient inside a bucket), or memory that
// something else owns (a shared-memory segment). Host memory
// (the "cpu" and "reference" devices) comes from a size-keyed cache of 64-byte aligned blocks, so a
// steady-state training step (same shapes every step) never touches malloc.
#pragma once

#include <cstddef>
#include <memory>

#include "core/device.h"

namespace dptrain {

class Backend;

class Storage {
 public:
  // Uninitialised buffer of `bytes` bytes on `device`.
  explicit Storage(std::size_t bytes, Device device = Device::cpu());
  // A window of `bytes` bytes at `offset` into `parent`, which it keeps alive; owns no memory.
  Storage(std::shared_ptr<Storage> parent, std::size_t offset, std::size_t bytes);
  // `bytes` bytes at `data` on `device`, which `owner` keeps valid for as long as this storage lives.
  Storage(void* data, std::size_t bytes, Device device, std::shared_ptr<const void> owner);
  // A buffer on `device` holding a copy of `bytes` bytes of host memory (Backend::upload).
  Storage(Device device, const void* host_src, std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }  // on device()
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
  Device device_;
  Backend* backend_ = nullptr;         // releases data_ (owning storages only)
  std::shared_ptr<Storage> parent_;    // set for windows
  std::shared_ptr<const void> owner_;  // set for memory owned elsewhere
};

using StoragePtr = std::shared_ptr<Storage>;

inline StoragePtr make_storage(std::size_t bytes, Device device = Device::cpu()) {
  return std::make_shared<Storage>(bytes, device);
}

// The host block cache behind the host backends: 64-byte aligned blocks, size rounded up to 64.
void* allocate_host_block(std::size_t bytes);
void release_host_block(void* block, std::size_t bytes);

// Bytes currently parked in the host cache and the number of fresh host allocations so far (for
// tests and benches).
struct StorageStats {
  std::size_t cached_bytes = 0;
  std::size_t fresh_allocations = 0;
};
StorageStats storage_stats();
// Returns all cached host blocks to the system.
void release_cached_storage();

}  // namespace dptrain
