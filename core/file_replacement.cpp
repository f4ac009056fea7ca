// FileReplacement: the temp file, the checks and the rename.
#include "core/file_replacement.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>
#include <utility>

#include "core/error.h"

namespace dptrain {

FileReplacement::FileReplacement(std::string path)
    : path_(std::move(path)), temp_(path_ + ".tmp." + std::to_string(::getpid())) {
  out_.open(temp_, std::ios::binary | std::ios::trunc);
  DPTRAIN_CHECK(out_.is_open(), path_, ": cannot open for writing (as ", temp_,
                ", renamed once whole: does the directory exist and is it writable?)");
}

FileReplacement::~FileReplacement() {
  if (committed_) return;
  out_.close();
  std::error_code ignored;
  std::filesystem::remove(temp_, ignored);
}

void FileReplacement::commit() {
  out_.close();
  DPTRAIN_CHECK(!out_.fail(), path_, ": write failed (disk full? permissions?); the file is as it was");
  std::error_code error;
  std::filesystem::rename(temp_, path_, error);
  DPTRAIN_CHECK(!error, path_, ": cannot rename ", temp_, " over it (", error.message(), ")");
  committed_ = true;
}

}  // namespace dptrain
