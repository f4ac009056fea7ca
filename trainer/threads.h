// How many CPU threads each rank uses when the config leaves it to the machine (`threads: 0`).
#pragma once

namespace dptrain::trainer {

// `configured` when positive; else the CPUs Slurm gave each task (SLURM_CPUS_PER_TASK, set under
// `srun -c` / `sbatch --cpus-per-task`; pass its value or null) when it holds a positive count;
// else the host's `cores` shared among the `ranks_on_host`, at least one each. Either of the last
// two at most `allowed_cpus`, the CPUs that the process may run on (its affinity mask).
int threads_per_rank(int configured, const char* slurm_cpus_per_task, int cores, int ranks_on_host,
                     int allowed_cpus);
// The CPUs in this process's affinity mask (mpirun's binding, taskset, a cgroup's cpuset), or the
// host's cores where the mask cannot be read.
int allowed_cpus_of_this_process();
// threads_per_rank for this process: its environment, this host's cores and its affinity mask.
int threads_for_this_process(int configured, int ranks_on_host);

}  // namespace dptrain::trainer
