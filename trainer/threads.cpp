// Threads per rank: the config, Slurm's allocation, or the host's cores shared among its ranks.
#include "trainer/threads.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace dptrain::trainer {

int threads_per_rank(int configured, const char* slurm_cpus_per_task, int cores, int ranks_on_host) {
  if (configured > 0) return configured;
  if (slurm_cpus_per_task != nullptr) {
    // Slurm's own count of the CPUs it set aside for each task: on a node shared with other jobs,
    // the node's cores divided by this job's ranks would take CPUs that belong to them.
    int cpus = 0;
    const char* end = slurm_cpus_per_task + std::strlen(slurm_cpus_per_task);
    const auto [last, error] = std::from_chars(slurm_cpus_per_task, end, cpus);
    if (error == std::errc() && last == end && cpus > 0) return cpus;
  }
  return std::max(1, cores / std::max(1, ranks_on_host));
}

int threads_for_this_process(int configured, int ranks_on_host) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return threads_per_rank(configured, std::getenv("SLURM_CPUS_PER_TASK"), cores, ranks_on_host);
}

}  // namespace dptrain::trainer
