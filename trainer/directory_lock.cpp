// DirectoryLock: flock on "<dir>/.dptrain.lock", holder named in the file.
#include "trainer/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.h"

namespace dptrain::trainer {
namespace {

std::string read_holder(int fd) {
  char text[512];
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  if (n <= 0) return "";
  std::string holder(text, static_cast<std::size_t>(n));
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
  return holder;
}

// "host node17, pid 4242, started 2026-11-24T14:02:11Z"
std::string this_holder() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char started[32];
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string("host ") + host + ", pid " + std::to_string(::getpid()) + ", started " + started;
}

bool same_file(int fd, const std::string& path) {
  struct stat opened {
  }, named{};
  return ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 && opened.st_dev == named.st_dev &&
         opened.st_ino == named.st_ino;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& key,
                             const std::function<void(const std::string&)>& report)
    : path_(dir + "/.dptrain.lock") {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  DPTRAIN_CHECK(!error, "cannot create the run directory ", dir, " (", key, "): ", error.message());
  while (true) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    DPTRAIN_CHECK(fd_ >= 0, "cannot create the lock file ", path_, ": ", errno_text(errno),
                  " (is the directory writable, the file system read-write?)");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int flock_error = errno;
      const std::string holder = read_holder(fd_);
      ::close(fd_);
      fd_ = -1;
      DPTRAIN_CHECK(flock_error != EWOULDBLOCK, dir, " is in use by another dptrain job (",
                    holder.empty() ? "holder not yet recorded" : holder,
                    "); wait for it to end, stop it, or give this run another output_dir / checkpoint.dir");
      DPTRAIN_FAIL("cannot lock ", path_, ": ", errno_text(flock_error),
                   " (a file system without flock? choose a local ", key, ")");
    }
    // A job that just ended removed the file after we opened it: lock the new one instead.
    if (same_file(fd_, path_)) break;
    ::close(fd_);
  }
  const std::string previous = read_holder(fd_);
  // Its holder is gone (the kernel released the lock) without removing the file: killed or crashed.
  if (!previous.empty())
    report("dptrain: " + dir + " was locked by a job that is no longer running (" + previous +
           "); taking it over");
  const std::string holder = this_holder() + "\n";
  DPTRAIN_CHECK(::ftruncate(fd_, 0) == 0 &&
                    ::pwrite(fd_, holder.data(), holder.size(), 0) == static_cast<ssize_t>(holder.size()),
                "cannot write ", path_, ": ", errno_text(errno));
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  // Removed while still locked, so a job waiting to open it finds it gone (same_file above).
  ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace dptrain::trainer
