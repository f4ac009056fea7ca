// GradientSync: how a step's gradients become the same average on every rank. The step calls it at
// fixed points and never asks which strategy runs (PyTorch DDP's communication hooks, flashlight's
// Reducer):
//   begin_step -> for each of this rank's micro-batches: before_backward, backward, after_backward
//     -> finish_step (the gradients now hold the average) -> clipping -> optimizer -> after_update
// Strategies are registered by name (distributed/gradient_sync.cpp, one line each) and made by
// make_gradient_sync: the bucketed overlapped allreduce with a wire encoding ("allreduce"),
// PowerSGD ("powersgd"), the exact fixed-point sum of distributed.deterministic ("exact_sum"), and
// no averaging at all, the compute-only baseline of scaling experiments ("local"). "allreduce" and
// "exact_sum" also shard the optimizer (ZeRO-1, distributed.shard_optimizer): the average is left in
// this rank's shard only (optimizer_shard), the optimizer updates that, and after_update all-gathers
// the parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/parameters.h"
#include "distributed/communicator.h"
#include "distributed/powersgd.h"
#include "distributed/reducer.h"
#include "distributed/shard_layout.h"

namespace dptrain::distributed {

// Everything any strategy is configured with (the config's distributed section).
struct GradientSyncOptions {
  std::string encoding = "none";  // the allreduce's wire encoding (distributed/gradient_encoding.h)
  double fusion_threshold_mb = 4;
  double first_bucket_mb = 1;
  bool overlap = true;
  bool check_finite = true;
  bool shard_optimizer = false;  // ZeRO-1 (distributed/shard_layout.h)
  PowerSgdOptions powersgd{};
  int64_t micro_batch_samples = 0;  // exact_sum: distributed.deterministic_micro_batch (for describe)
};

// The bucketed allreduce's options in `encoding` (what "allreduce" and "powersgd" build it with).
ReducerOptions reducer_options(const GradientSyncOptions& options, const std::string& encoding);

struct GradientSyncContext {
  Communicator& comm;       // for the gradients (the device's buffers on a GPU)
  Communicator& host_comm;  // host memory: state hand-outs at start and for checkpoints
  const FlatParameters& parameters;
  GradientSyncOptions options;
};

// A step as this rank runs it: `micro_batches` backward passes here, `global_micro_batches` on all
// ranks together (the same count everywhere, except in deterministic mode's fixed plan).
struct StepShape {
  int64_t step = 0;  // the global step: labels messages, picks PowerSGD's phase
  int64_t micro_batches = 1;
  int64_t global_micro_batches = 1;
};

// Finds a strategy's state in a checkpoint being resumed: the tensor stored under `name`, or null.
using StateLookup = std::function<const Tensor*(const std::string& name)>;

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // The ranks whose gradients finish_step() averages: a regular step seeds each backward pass with
  // 1 / (passes x this), so that the strategy's sums are averages.
  virtual int ranks_in_average() const = 0;
  virtual void begin_step(const StepShape& shape) = 0;
  // Around the backward of this rank's micro-batch `index` (0-based, in order).
  virtual void before_backward(int64_t /*index*/) {}
  virtual void after_backward(int64_t /*index*/) {}
  // Leaves the average over every rank's micro-batches in the gradients, the same on every rank.
  // Throws, naming the step and parameter, if an average is not finite (with check_finite); on a
  // GPU the check may be deferred (update_skip_flag, check_deferred).
  virtual void finish_step() = 0;
  // A deferred finiteness check's flag: an int32 in the gradients' device memory that the optimizer
  // reads (nonzero: the update is skipped), or null where finish_step checks at once.
  virtual const int32_t* update_skip_flag() const { return nullptr; }
  // Throws if a deferred check flagged a step; called where the host synchronizes anyway (a log
  // line, a checkpoint, the end of an epoch).
  virtual void check_deferred() {}

  // With a sharded optimizer: the ranges of the flat buffers where finish_step() leaves the average,
  // which this rank's optimizer updates; null when every rank updates everything.
  virtual const ShardLayout* optimizer_shard() const { return nullptr; }
  // After the optimizer's update: with a sharded optimizer, every rank's updated ranges to every rank.
  virtual void after_update() {}

  // Seconds spent inside backward's hooks since the last call (communication, not compute).
  virtual double take_seconds_in_backward() { return 0; }
  // Bytes this rank contributes to the gradient collectives of step `step` (on more than one rank).
  virtual int64_t payload_bytes(int64_t step) const = 0;
  // The gradient buckets' sizes in bytes, in launch order (none for strategies without buckets).
  virtual std::vector<int64_t> bucket_bytes() const { return {}; }
  // One line for the run's summary (after "gradients: "); more lines may follow, each complete.
  virtual std::string describe() const = 0;

  // Training state beyond the optimizer's. Collective (every rank calls it): the tensors a
  // checkpoint holds, named. Rank 0 writes them.
  virtual std::vector<NamedTensor> checkpoint_state() { return {}; }
  // Rank 0, resuming: restores what it can from the checkpoint at `path`; missing or mismatched
  // state is reported and started afresh, never an error (a strategy may be switched at a resume).
  virtual void resume_state(const StateLookup& /*find*/, const std::string& /*path*/) {}
  // Collective, before the first step: every rank takes its part of rank 0's state.
  virtual void share_state_from_rank0() {}
};

struct GradientSyncEntry {
  const char* name;
  std::unique_ptr<GradientSync> (*make)(const GradientSyncContext& context);
  // The tensors its checkpoint_state() may write: ignored in a checkpoint by a run without it.
  std::vector<std::string> state_names;
  // Whether distributed.compression may name it (as "powersgd"), beside the wire encodings.
  bool is_compression = false;
  // Whether it runs with options.shard_optimizer (distributed.shard_optimizer).
  bool shards_optimizer = false;
};

std::unique_ptr<GradientSync> make_gradient_sync(const std::string& name, const GradientSyncContext& context);
std::vector<std::string> gradient_sync_names();
// Every registered strategy's state names.
std::vector<std::string> gradient_sync_state_names();
// What distributed.compression accepts: the wire encodings, then the strategies that compress.
std::vector<std::string> compression_names();
// The strategies that run with a sharded optimizer.
std::vector<std::string> sharding_gradient_sync_names();

}  // namespace dptrain::distributed
