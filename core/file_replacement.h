// FileReplacement: a file written beside its final name and renamed over it once whole.
#pragma once

#include <fstream>
#include <string>

namespace dptrain {

// Writes under a temporary name beside `path` ("<path>.tmp.<pid>") and renames over `path` on
// commit(). A reader that has the old file open or mapped keeps reading it whole: a rewrite in place
// truncated it under them (a training job with the file mapped died of SIGBUS, and an export whose
// source was its own target read what it was writing). A write that fails, or is never committed,
// leaves the old file and no temp file.
class FileReplacement {
 public:
  explicit FileReplacement(std::string path);
  ~FileReplacement();  // uncommitted: removes the temp file
  FileReplacement(const FileReplacement&) = delete;
  FileReplacement& operator=(const FileReplacement&) = delete;

  std::ofstream& out() { return out_; }
  // Closes, checks every write and renames over the path; throws naming it when any of that failed.
  void commit();

 private:
  std::string path_, temp_;
  std::ofstream out_;
  bool committed_ = false;
};

}  // namespace dptrain
