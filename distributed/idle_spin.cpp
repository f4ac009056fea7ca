// Idle-priority spinning threads (distributed/idle_spin.h).
#include "distributed/idle_spin.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <sstream>
#include <system_error>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dptrain::distributed {

namespace {

double seconds_of(clockid_t clock, const char* which) {
  timespec used{};
  DPTRAIN_CHECK(clock_gettime(clock, &used) == 0, "clock_gettime of ", which,
                " failed: ", std::strerror(errno));
  return static_cast<double>(used.tv_sec) + 1e-9 * static_cast<double>(used.tv_nsec);
}

void spin_until(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
#if defined(__x86_64__)
    _mm_pause();  // leaves a sibling hyperthread the core's issue slots, and saves power
#endif
  }
}

}  // namespace

IdleSpinners::IdleSpinners(int threads) {
  // The spinners take no signal: SIGINT and SIGTERM stay with the threads that act on them.
  sigset_t all, previous;
  sigfillset(&all);
  DPTRAIN_CHECK(pthread_sigmask(SIG_BLOCK, &all, &previous) == 0, "pthread_sigmask failed",
                " while starting the idle spinners");
  for (int t = 0; t < threads && why_not_.empty(); ++t) {
    std::promise<int> started;
    std::future<int> status = started.get_future();
    std::thread thread;
    try {
      thread = std::thread([this, started = std::move(started)]() mutable {
        sched_param priority{};
        const int error = pthread_setschedparam(pthread_self(), SCHED_IDLE, &priority);
        started.set_value(error);
        if (error == 0) spin_until(stop_);
      });
    } catch (const std::system_error& error) {
      why_not_ = std::string("no thread: ") + error.what();
      break;
    }
    clockid_t clock{};
    if (const int error = status.get(); error != 0)
      why_not_ = std::string("SCHED_IDLE refused: ") + std::strerror(error);
    else if (const int error = pthread_getcpuclockid(thread.native_handle(), &clock); error != 0)
      why_not_ = std::string("pthread_getcpuclockid failed: ") + std::strerror(error);
    threads_.push_back(std::move(thread));
    clocks_.push_back(clock);
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (!why_not_.empty()) {  // all or none: with fewer spinners than cores, some of them still halt
    stop_.store(true);
    for (std::thread& thread : threads_) thread.join();
    threads_.clear(), clocks_.clear();
  }
}

IdleSpinners::~IdleSpinners() {
  stop_.store(true);
  for (std::thread& thread : threads_) thread.join();
}

double IdleSpinners::cpu_seconds() const {
  double seconds = 0;
  for (const clockid_t clock : clocks_) seconds += seconds_of(clock, "an idle spinner's CPU clock");
  return seconds;
}

std::string cpu_time_ration(const std::string& proc_cgroup, const std::string& root) {
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    const std::size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::string hierarchy, file, unlimited;
    if (controllers.empty()) {  // v2: one hierarchy; cpu.max is "QUOTA PERIOD" or "max PERIOD"
      hierarchy = root, file = "cpu.max", unlimited = "max";
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {
      hierarchy = root + "/" + controllers, file = "cpu.cfs_quota_us", unlimited = "-1";
    } else {
      continue;
    }
    // From the process's own cgroup up to the hierarchy's root: a limit anywhere above applies too
    // (and inside a container the process's path may name cgroups the container cannot see).
    for (std::string path = line.substr(second + 1);;) {
      while (!path.empty() && path.back() == '/') path.pop_back();
      const std::string at = hierarchy + path + "/" + file;
      std::ifstream limit(at);
      std::string value;
      if (std::getline(limit, value) && !value.empty() && value.substr(0, value.find(' ')) != unlimited)
        return at + ": " + value;
      if (path.empty()) break;
      const std::size_t slash = path.rfind('/');
      path.erase(slash == std::string::npos ? 0 : slash);
    }
  }
  return "";
}

std::string cpu_time_ration() {
  std::ifstream file("/proc/self/cgroup");
  return cpu_time_ration(std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()));
}

double rank_cpu_seconds(const IdleSpinners* spinners) {
  return seconds_of(CLOCK_PROCESS_CPUTIME_ID, "the process's CPU clock") -
         (spinners != nullptr ? spinners->cpu_seconds() : 0.0);
}

}  // namespace dptrain::distributed
