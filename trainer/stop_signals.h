// Stop requests by signal, as clusters send them: SIGTERM (Slurm's preemption and time limit, a
// plain kill), SIGUSR1 (the warning of sbatch --signal=USR1@T), SIGINT (Ctrl-C). The handlers only
// record the signal; the training loop polls between steps, the ranks agree on the step to stop at,
// rank 0 writes a checkpoint there and every rank exits with kExitStoppedWithCheckpoint. A second
// SIGINT ends the process at once.
#pragma once

#include <cstdint>
#include <string>

namespace dptrain::trainer {

// A run that stopped on request after its checkpoint was written: "resume me" (--resume auto).
// EX_TEMPFAIL of sysexits.h, "a temporary failure; the user is invited to retry".
inline constexpr int kExitStoppedWithCheckpoint = 75;
// A second SIGINT: 128 + SIGINT, what a shell reports for a process that SIGINT ended.
inline constexpr int kExitInterrupted = 130;

// Installs the handlers of SIGTERM, SIGINT and SIGUSR1 for this process.
void install_stop_handlers();

// The first stop signal this process received, 0 if none.
int received_stop_signal();

// Forgets a received signal and the SIGINT count (tests).
void clear_stop_signal();

// How many ranks asked to stop, by signal; summed over the ranks, each rank counting its own.
struct StopRequests {
  int64_t sigterm = 0, sigint = 0, sigusr1 = 0;

  static StopRequests of_this_process();
  bool any() const { return sigterm + sigint + sigusr1 > 0; }
  // "SIGTERM on 1 rank", "SIGUSR1 on 2 ranks and SIGTERM on 1 rank".
  std::string describe() const;
};

}  // namespace dptrain::trainer
