// Storage: 64-byte aligned host buffers recycled through a size-keyed cache, so a
// steady-state training step (same shapes every step) never touches malloc.
#pragma once

#include <cstddef>
#include <memory>

namespace dptrain {

class Storage {
 public:
  // Uninitialised buffer of `bytes` bytes (rounded up to 64), taken from the cache when possible.
  explicit Storage(std::size_t bytes);
  // A window of `bytes` bytes at `offset` into `parent`, which it keeps alive (e.g. a gradient that
  // lives inside a communication bucket).
  Storage(std::shared_ptr<Storage> parent, std::size_t offset, std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_;
  std::size_t bytes_;
  std::shared_ptr<Storage> parent_;  // set for windows; they own no memory
};

using StoragePtr = std::shared_ptr<Storage>;

inline StoragePtr make_storage(std::size_t bytes) { return std::make_shared<Storage>(bytes); }

// Bytes currently parked in the cache and the number of fresh allocations so far (for tests and benches).
struct StorageStats {
  std::size_t cached_bytes = 0;
  std::size_t fresh_allocations = 0;
};
StorageStats storage_stats();
// Returns all cached buffers to the system.
void release_cached_storage();

}  // namespace dptrain
