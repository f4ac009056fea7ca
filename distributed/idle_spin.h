// Idle-priority threads that keep a rank's cores running while the rank waits for a peer.
#pragma once

#include <atomic>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace dptrain::distributed {

// A rank of synchronous training waits for its slowest peer every step. Its threads sleep then (a
// spinning communication thread would take the core from its own backward), and a core with nothing
// to run halts: on a virtual machine that hands the core back to the host, which may run other work
// on it and resumes this rank late, with caches that others have used. These threads spin under
// SCHED_IDLE, which Linux runs only on a CPU that has nothing else to run and preempts as soon as
// anything else wakes there: the rank's own threads lose nothing but the scheduler's tick, and its
// cores never halt. resnet18 at np 2 on a 2-core AMD EPYC VM: median +2.8% img/s over 10 blocks of
// interleaved runs with and without (docs/results.md). Like MPI's busy polling, the cost is a core
// that shows 100% busy while the rank waits.
class IdleSpinners {
 public:
  // Starts `threads` spinners (one for each of the rank's compute threads, so that each core the rank
  // runs on can be kept running). Where the OS refuses SCHED_IDLE none runs: a spinner at normal
  // priority would take time from the rank; why_not() says why.
  explicit IdleSpinners(int threads);
  ~IdleSpinners();
  IdleSpinners(const IdleSpinners&) = delete;
  IdleSpinners& operator=(const IdleSpinners&) = delete;

  int running() const { return static_cast<int>(threads_.size()); }
  const std::string& why_not() const { return why_not_; }
  // CPU time the spinners have used so far (to leave out of the rank's own CPU time).
  double cpu_seconds() const;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::vector<clockid_t> clocks_;
  std::string why_not_;
};

// This process's CPU time (every thread) less the spinners' (null: none): the CPU time the rank used.
double rank_cpu_seconds(const IdleSpinners* spinners);

// Where this process's CPU time is rationed (a container's --cpus, a Kubernetes CPU limit): the
// cgroup file that sets the limit, in the process's cgroup or one above it, and the limit ("" where
// none is). Under a ration the spinners would spend the time that the rank's compute needs after a
// wait. `proc_cgroup` is /proc/self/cgroup's text (cgroup v2's "0::PATH", or v1's "ID:cpu,...:PATH"
// lines); `root` is where the hierarchies are mounted.
std::string cpu_time_ration(const std::string& proc_cgroup, const std::string& root = "/sys/fs/cgroup");
std::string cpu_time_ration();  // of this process

}  // namespace dptrain::distributed
