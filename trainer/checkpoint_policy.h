// When checkpoints are written, and what starting a run does with the ones on disk: the policy
// (decided here, and only here), the fresh start's clean-up, and finding the checkpoint that
// --resume auto|PATH continues from. The file format itself is trainer/checkpoint_file.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "trainer/checkpoint_file.h"
#include "trainer/config.h"
#include "trainer/faults.h"

namespace dptrain::trainer {

class Checkpoints {
 public:
  Checkpoints(const CheckpointConfig& config, int rank, InjectedFault fault);

  // By step count: after a step that is not an epoch's last (that one waits for the evaluation).
  bool due_after_step(int64_t global_step) const;
  // At an epoch's end, after its evaluation: by epoch count (unless training.max_steps cut the epoch
  // short) or by step count.
  bool due_at_epoch_end(int64_t epoch, int64_t global_step, bool stopped_early) const;
  // When training ends, unless the newest checkpoint is of this very step.
  bool due_at_end(int64_t global_step) const { return last_written_step_ != global_step; }

  // Rank 0 writes `data` durably as the checkpoint of its step and prunes the oldest; every rank
  // records the step. Returns the line to report ("" on other ranks).
  std::string save(const CheckpointData& data);
  // Counts the checkpoint a run resumed from as written (none is due again at that step).
  void resumed_at(int64_t global_step) { last_written_step_ = global_step; }

  // Rank 0 of a fresh start: removes an earlier run's checkpoints, whose higher step numbers would
  // otherwise win a later --resume auto, and those it set aside. Returns the line to report, "" when
  // there were none.
  std::string clear_earlier() const;
  // Rank 0 of a resumed run: sets aside (set_checkpoint_aside) the checkpoints of steps past the one
  // it resumed from (a run rolled back with --resume PATH, or ones --resume auto passed over), whose
  // higher steps would outrank its own in pruning and in a later --resume auto. Returns the line to
  // report, "" when there were none.
  std::string set_aside_after(int64_t global_step) const;
  // Rank 0: whether the last save() failed to write ("warn" goes on without it).
  bool last_write_failed() const { return last_write_failed_; }

  // Rank 0: the checkpoint to continue from. "auto": the newest in checkpoint.dir that reads,
  // validates and passes `accept` (each one rejected is reported on stderr); none there: nullopt;
  // some there but none usable: throws rather than start afresh among them. A path: that one, or throw.
  // `accept` throws when a checkpoint does not fit the configured run.
  std::optional<Checkpoint> find(const std::string& which,
                                 const std::function<void(const Checkpoint&)>& accept) const;

 private:
  const CheckpointConfig& config_;
  int rank_;
  InjectedFault fault_;
  int64_t last_written_step_ = -1;
  bool last_write_failed_ = false;
};

}  // namespace dptrain::trainer
