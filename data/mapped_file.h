// MappedFile: a whole file mapped read-only, so data sets larger than memory are paged in on demand
// and their pages count as the file's, not the process's anonymous memory.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace dptrain::data {

class MappedFile {
 public:
  // Throws dptrain::Error naming the path (missing, a directory, unreadable). An empty file maps to
  // an empty span.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dptrain::data
