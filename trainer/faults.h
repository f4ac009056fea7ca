// Fault injection for the tests of the failure guarantees: DPTRAIN_INJECT_FAULT=RANK:STEP[:KIND]
// makes that rank fail when STEP optimizer steps are done:
//   throw (default)     throws before the next step: "one rank fails, the whole job stops"
//   kill                SIGKILLs itself there: a job killed between two checkpoints
//   kill_in_checkpoint  rank 0 SIGKILLs itself half-way through writing that step's checkpoint
//   hang                says so on stderr and waits for signals forever: a rank stuck in its step
//                       (what a second SIGINT is for), deterministic where timing is not
//   sigusr1             sends itself SIGUSR1 there: the job stops after that very step (one that
//                       ends an epoch, say), which a signal from outside hits only by chance
//   slow:MS             sleeps MS milliseconds before that step and every later one: a run that is
//                       sure to be still training a given time after a step, however fast the
//                       machine, so that the tests which signal a run mid-way can keep it short
// Unset in normal use, and then it costs two comparisons per step.
#pragma once

#include <cstdint>

namespace dptrain::trainer {

class InjectedFault {
 public:
  // From DPTRAIN_INJECT_FAULT; throws on a malformed value.
  static InjectedFault from_environment();

  // Throws, SIGKILLs, hangs or sleeps as configured when this rank has done `steps_done` steps.
  void before_step(int rank, int64_t steps_done) const;
  // Whether the checkpoint of `step` written by `rank` is to be cut short (kill_in_checkpoint).
  bool kills_checkpoint(int rank, int64_t step) const;

 private:
  enum class Kind { kNone, kThrow, kKill, kKillInCheckpoint, kHang, kSigusr1, kSlow };
  Kind kind_ = Kind::kNone;
  int rank_ = -1;
  int64_t step_ = -1;
  int64_t slow_ms_ = 0;
};

}  // namespace dptrain::trainer
