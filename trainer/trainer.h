// Trainer: one training run on this process's rank, from building the model to the final weights.
// Internal to trainer/ (run.h is the interface): run.cpp holds the set-up, the epoch loop and
// evaluation, step.cpp the optimizer step, resume_and_save.cpp checkpoints, benchmark.cpp the timed
// steps of bench/train_bench.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/parameters.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "distributed/communicator.h"
#include "distributed/exact_sum.h"
#include "distributed/gradient_sync.h"
#include "distributed/world.h"
#include "layers/module.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "trainer/checkpoint_policy.h"
#include "trainer/config.h"
#include "trainer/progress.h"
#include "trainer/report.h"
#include "trainer/run_types.h"
#include "trainer/step_metrics.h"
#include "trainer/stop_signals.h"

namespace dptrain::trainer {

// Written by rank 0 when a signal stopped the run (Trainer::write_stop_note); removed when a run starts.
inline std::string stop_note_path(const Config& c) {
  return c.output_dir + "/stopped.json";
}

class Trainer {
 public:
  Trainer(const Config& config, const distributed::World& world);
  ~Trainer();

  // Rank 0 alone reads files (the checkpoint to resume, model.init_from), so no shared filesystem
  // is needed; then every rank takes rank 0's parameters, optimizer state and position.
  void start(const RunOptions& options);
  TrainingResult run();
  Evaluation evaluate_checkpoint(const std::string& path);
  BenchmarkResult benchmark(const BenchmarkOptions& options);

 private:
  // Running sums over the steps of an epoch (or of a benchmark), this rank only.
  struct StepTotals {
    distributed::ExactScalarSum loss_sum;  // per-sample losses: the same bits for any split into ranks
    int64_t correct = 0, samples = 0, steps = 0;
    int64_t payload_bytes = 0;  // what this rank contributed to the gradient collectives
    double data = 0, forward = 0, backward = 0, communication = 0, optimizer = 0;  // seconds
    ClippingStats clipping;  // optimizer.max_grad_norm only
  };
  // A batch as tensors on the run's device (host copies on the CPU are the tensors themselves).
  struct Batch {
    Tensor inputs;
    std::vector<int32_t> labels;
    Tensor targets;  // regression only
  };
  // One backward pass of a step on this rank.
  struct MicroBatch {
    std::span<const int64_t> indices;
    float loss_scale;  // backward's seed: what makes the gradient sync's sum the step's average
    uint64_t dropout_seed;
  };
  // One optimizer step on this rank: its micro-batches in order, as llm.c's accumulation loop runs
  // them. Regular mode: backward_passes_per_step sampler batches, each weighted 1 / (passes x the
  // ranks the gradient sync averages over).
  // Deterministic mode: the step's global batch cut into fixed micro-batches in the sampler's order,
  // each weighted by its share of the step's samples.
  struct StepPlan {
    std::vector<MicroBatch> micro_batches;
    int64_t global_micro_batches = 0;               // on all ranks
    int64_t samples_before = 0, samples_after = 0;  // of the epoch's permutation, all ranks
  };

  EpochMetrics train_epoch(int64_t epoch);
  // The test set's loss and accuracy into `m`, then `m` into the result, the log and metrics.jsonl.
  void evaluate_and_record(EpochMetrics& m, TrainingResult& result, MetricsLog& metrics);
  // The epoch's metrics, summed (or, for memory, the largest) over all ranks: a collective.
  EpochMetrics allreduce_epoch_metrics(int64_t epoch, const StepTotals& totals, int64_t first_sample,
                                       double epoch_seconds, bool stopped_early);
  // Whether any rank received a stop signal, agreed by all after each step.
  StopRequests agree_on_stop() const;
  void write_stop_note(const std::string& why) const;
  void refuse_to_discard_a_stopped_run() const;
  void train_step(int64_t epoch, int64_t step_in_epoch, StepTotals& totals);
  double averaged_gradient_norm();  // global L2, every rank the same; collective when sharded
  const StepPlan& plan_step(int64_t step_in_epoch);
  std::vector<std::span<const int64_t>> micro_batches_of(std::span<const int64_t> batch) const;
  Tensor loss_of(const Tensor& output) const;  // model.loss on the current batch
  // The loss and correct predictions of a forward pass, bound for `totals` (StepMetrics: read at the
  // next flush_metrics).
  void count_batch(const Tensor& output, const Tensor& loss, StepTotals& totals);
  // Brings `totals` up to date with the batches counted so far and, with `check_gradients`, throws if
  // a deferred gradient check flagged a step: where the host waits for the device anyway (a log line,
  // an epoch's end). Every rank must check at the same steps.
  void flush_metrics(StepTotals& totals, bool check_gradients = true);
  Evaluation evaluate();
  // Whether BatchNorm buffers are rank 0's on every rank (broadcast before each step and evaluation).
  bool buffers_follow_rank0() const;
  void broadcast_buffers_from_rank0();
  // The loader's next batch, which holds `indices`, as the tensors of batch_.
  void load_batch(data::BatchLoader& loader, std::span<const int64_t> indices);
  // Hands the loader this epoch's micro-batches in the order the steps take them; after set_epoch.
  void start_loading(int64_t sampler_epoch);
  void report_bad_samples(data::BatchLoader& loader, const std::string& where) const;
  std::vector<NamedTensor> model_state() const;  // parameters and buffers, as checkpoints hold them

  void resume(const std::string& which);
  void init_from(const std::string& path);
  void save_checkpoint();
  // The optimizer's state per parameter, as a checkpoint holds it. Collective when the optimizer is
  // sharded: every rank's part is gathered into whole buffers (briefly, the memory sharding saves).
  std::vector<NamedTensor> optimizer_state_whole();
  bool step_limit_reached() const;
  // The steps the run has left after step `step` (0-based) of `steps` in epoch `epoch`.
  int64_t steps_left_after(int64_t epoch, int64_t step, int64_t steps) const;
  StepTimes mean_step_times(const StepTotals& totals, double wall_seconds);
  uint64_t dropout_seed_of_pass(int64_t pass) const;
  uint64_t dropout_seed_of_micro_batch(int64_t global_micro_batch) const;
  void check_deterministic_resume(const Checkpoint& checkpoint) const;
  void check_classes(const Checkpoint& checkpoint) const;
  void check_sampling(const Checkpoint& checkpoint) const;
  Json deterministic_metadata() const;        // what a checkpoint records of distributed.deterministic
  int64_t global_batch() const;               // samples per optimizer step, all ranks (full steps)
  int64_t optimizer_steps_per_epoch() const;  // the sampler's batches, batches_per_step_ to a step
  RunSummary summary() const;

  const Config& config_;
  const distributed::World& world_;
  Device device_;
  std::unique_ptr<distributed::Communicator> comm_;         // host memory: metrics, checks, the timeline
  std::unique_ptr<distributed::Communicator> device_comm_;  // the device's buffers; null on the CPU
  distributed::Communicator* state_comm_;                   // the one for parameters and gradients
  std::unique_ptr<layers::Sequential> model_;  // built first: synthetic data takes its classes from it
  std::unique_ptr<data::Dataset> train_set_, test_set_;
  const bool deterministic_;  // distributed.deterministic
  data::ShardedSampler sampler_;
  // Sampler batches per optimizer step: backward_passes_per_step, or 1 in deterministic mode, whose
  // sampler batch is the whole step's (cut into micro-batches).
  int64_t batches_per_step_;
  std::unique_ptr<StepMetrics> train_metrics_;  // per-batch loss and accuracy, read in batches
  std::unique_ptr<FlatParameters> parameters_;
  // BatchNorm's running statistics and counters in one flat buffer (its gradient half goes unused),
  // so broadcasting them is one collective.
  std::unique_ptr<FlatParameters> buffers_;
  std::unique_ptr<ops::CrossReplicaSum>
      batch_stats_sync_;  // distributed.sync_batchnorm on more than one rank
  std::unique_ptr<optim::Optimizer> optimizer_;
  // A sharded optimizer's state in the flat layout while it is whole: on rank 0 from a resumed
  // checkpoint until start() hands it out; empty otherwise.
  std::vector<Tensor> whole_optimizer_state_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<distributed::GradientSync> gradient_sync_;
  StepPlan plan_;  // the current step's; kept to reuse its storage
  Progress progress_;
  std::chrono::steady_clock::time_point run_start_{};  // when run() began: the progress' elapsed time
  InjectedFault fault_;
  Checkpoints checkpoints_;
  std::unique_ptr<data::BatchLoader> train_loader_, test_loader_;
  std::vector<int64_t> test_indices_;  // 0, 1, ..., what evaluate's batches view
  Batch batch_;
  // BenchmarkOptions::fixed_batch: batch_ stays as the first step left it and the loader rests.
  bool batch_is_fixed_ = false;
  TrainingPosition position_;
  bool resumed_ = false;
  StopRequests stop_;  // agreed by all ranks; any(): the loop ends after this step
  double lr_ = 0;
  uint64_t checksum_ = 0;
};

}  // namespace dptrain::trainer
