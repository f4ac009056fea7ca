// Size-keyed cache of aligned buffers behind Storage.
#include "core/storage.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>
#include <vector>

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

std::size_t round_up(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

Storage::Storage(std::size_t bytes) : data_(nullptr), bytes_(round_up(bytes)) {
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free_by_size.find(bytes_);
    if (it != c.free_by_size.end() && !it->second.empty()) {
      data_ = it->second.back();
      it->second.pop_back();
      c.stats.cached_bytes -= bytes_;
      return;
    }
    ++c.stats.fresh_allocations;
  }
  data_ = std::aligned_alloc(kAlignment, bytes_);
  if (data_ == nullptr) throw std::bad_alloc();
}

Storage::Storage(std::shared_ptr<Storage> parent, std::size_t offset, std::size_t bytes)
    : data_(static_cast<char*>(parent->data()) + offset), bytes_(bytes), parent_(std::move(parent)) {
  if (offset + bytes > parent_->bytes()) throw std::out_of_range("Storage window past the end of its parent");
}

Storage::~Storage() {
  if (parent_) return;
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.free_by_size[bytes_].push_back(data_);
  c.stats.cached_bytes += bytes_;
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
