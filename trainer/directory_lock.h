// One job per run directory: rank 0 holds an flock(2) on "<dir>/.dptrain.lock" while it trains, and
// the file names the holder (host, pid, start time), so a second job pointed at the same output_dir
// (a requeued job beside its predecessor, a copied script) stops at start naming who has it, instead
// of deleting or overwriting the other's checkpoints. The kernel drops the lock of a process that
// dies, so a file left by a killed job is taken over, saying whose it was.
#pragma once

#include <functional>
#include <string>

namespace dptrain::trainer {

class DirectoryLock {
 public:
  // Creates `dir` if needed and takes its lock, or throws naming the holder and `key`, the config key
  // that named the directory. `report` receives the line that says a dead job's lock was taken over.
  DirectoryLock(const std::string& dir, const std::string& key,
                const std::function<void(const std::string&)>& report);
  // Removes the lock file, then releases the lock.
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace dptrain::trainer
