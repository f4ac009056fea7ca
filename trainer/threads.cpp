// Threads per rank: the config, Slurm's allocation, or the host's cores shared among its ranks, within
// the CPUs the process is bound to.
#include "trainer/threads.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace dptrain::trainer {

int threads_per_rank(int configured, const char* slurm_cpus_per_task, int cores, int ranks_on_host,
                     int allowed_cpus) {
  if (configured > 0) return configured;
  // More threads than the CPUs a rank is bound to take turns on them, and OpenMP's threads spin at
  // every barrier while they wait for one that is not running: under `mpirun -np 1`, which binds its
  // one rank to one core, two threads on this 2-core host made the MNIST MLP 59x slower and the CNN
  // 3.9x.
  const int allowed = std::max(1, allowed_cpus);
  if (slurm_cpus_per_task != nullptr) {
    // Slurm's own count of the CPUs it set aside for each task: on a node shared with other jobs,
    // the node's cores divided by this job's ranks would take CPUs that belong to them.
    int cpus = 0;
    const char* end = slurm_cpus_per_task + std::strlen(slurm_cpus_per_task);
    const auto [last, error] = std::from_chars(slurm_cpus_per_task, end, cpus);
    if (error == std::errc() && last == end && cpus > 0) return std::min(cpus, allowed);
  }
  return std::clamp(cores / std::max(1, ranks_on_host), 1, allowed);
}

int allowed_cpus_of_this_process() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return cores;
  return std::max(1, CPU_COUNT(&mask));
}

int threads_for_this_process(int configured, int ranks_on_host) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return threads_per_rank(configured, std::getenv("SLURM_CPUS_PER_TASK"), cores, ranks_on_host,
                          allowed_cpus_of_this_process());
}

}  // namespace dptrain::trainer
