// Device buffers through the backends, windows, and the size-keyed host block cache.
#include "core/storage.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/backend.h"
#include "core/error.h"

namespace dptrain {
namespace {

constexpr std::size_t kAlignment = 64;

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free_by_size;
  StorageStats stats;

  ~Cache() {
    for (auto& [bytes, blocks] : free_by_size)
      for (void* block : blocks) std::free(block);
  }
};

Cache& cache() {
  static Cache instance;
  return instance;
}

std::size_t round_up(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace

void* allocate_host_block(std::size_t bytes) {
  bytes = round_up(bytes);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free_by_size.find(bytes);
    if (it != c.free_by_size.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      c.stats.cached_bytes -= bytes;
      return block;
    }
    ++c.stats.fresh_allocations;
  }
  void* block = std::aligned_alloc(kAlignment, bytes);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}

void release_host_block(void* block, std::size_t bytes) {
  bytes = round_up(bytes);
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.free_by_size[bytes].push_back(block);
  c.stats.cached_bytes += bytes;
}

Storage::Storage(std::size_t bytes, Device device)
    : bytes_(bytes), device_(device), backend_(&backend_for(device)) {
  data_ = backend_->allocate(bytes_);
}

Storage::Storage(std::shared_ptr<Storage> parent, std::size_t offset, std::size_t bytes)
    : data_(static_cast<char*>(parent->data()) + offset),
      bytes_(bytes),
      device_(parent->device()),
      parent_(std::move(parent)) {
  DPTRAIN_CHECK(offset + bytes <= parent_->bytes(), "storage window [", offset, ", ", offset + bytes,
                ") runs past the end of its parent (", parent_->bytes(), " bytes)");
}

Storage::Storage(void* data, std::size_t bytes, Device device, std::shared_ptr<const void> owner)
    : data_(data), bytes_(bytes), device_(device), owner_(std::move(owner)) {}

Storage::Storage(Device device, const void* host_src, std::size_t bytes)
    : bytes_(bytes), device_(device), backend_(&backend_for(device)) {
  data_ = backend_->upload(host_src, bytes_);
}

Storage::~Storage() {
  if (backend_) backend_->release(data_, bytes_);
}

StorageStats storage_stats() {
  std::lock_guard lock(cache().mutex);
  return cache().stats;
}

void release_cached_storage() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  for (auto& [bytes, blocks] : c.free_by_size)
    for (void* block : blocks) std::free(block);
  c.free_by_size.clear();
  c.stats.cached_bytes = 0;
}

}  // namespace dptrain
