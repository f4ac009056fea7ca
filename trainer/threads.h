// How many CPU threads each rank uses when the config leaves it to the machine (`threads: 0`).
#pragma once

namespace dptrain::trainer {

// `configured` when positive; else the CPUs Slurm gave each task (SLURM_CPUS_PER_TASK, set under
// `srun -c` / `sbatch --cpus-per-task`; pass its value or null) when it holds a positive count;
// else the host's `cores` shared among the `ranks_on_host`, at least one each.
int threads_per_rank(int configured, const char* slurm_cpus_per_task, int cores, int ranks_on_host);
// The same for this process: its environment and this host's cores, shared among `ranks_on_host`.
int threads_for_this_process(int configured, int ranks_on_host);

}  // namespace dptrain::trainer
