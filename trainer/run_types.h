// What a training run takes and gives back: its options, its per-epoch metrics and step times, the
// benchmark's and the evaluation's results (trainer/run.h has the functions; the Trainer and the
// reports share these types).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config.h"

namespace dptrain::trainer {

// Where a step's time goes, in seconds per optimizer step, averaged over the ranks.
struct StepTimes {
  double data = 0;           // gathering the batch
  double compute = 0;        // forward and backward, without the communication done inside backward
  double communication = 0;  // communication and averaging that did not overlap with compute
  double optimizer = 0;
  double total = 0;  // wall time per step, including waits for slower ranks
};

// The averaged gradients' global norm (before clipping) over an epoch's steps, where
// optimizer.max_grad_norm clips. Every rank computes the same norms.
struct ClippingStats {
  int64_t steps = 0, clipped_steps = 0;
  double norm_sum = 0, norm_max = 0, last_norm = 0;
  void add(double norm, bool clipped) {
    ++steps;
    clipped_steps += clipped ? 1 : 0;
    norm_sum += norm;
    norm_max = std::max(norm_max, norm);
    last_norm = norm;
  }
  double norm_mean() const { return steps > 0 ? norm_sum / static_cast<double>(steps) : 0.0; }
};

struct EpochMetrics {
  int64_t epoch = 0;                          // 1-based
  int64_t step = 0;                           // optimizer steps taken so far
  double train_loss = 0, train_accuracy = 0;  // averaged over all ranks' samples
  double test_loss = 0, test_accuracy = 0;
  double samples_per_sec = 0, samples_per_sec_per_rank = 0, epoch_seconds = 0;
  double lr = 0;               // at the end of the epoch
  bool stopped_early = false;  // training.max_steps ended this epoch
  int64_t first_sample = 0;    // > 0: a resumed epoch, begun at this sample of its permutation
  StepTimes step_times;
  // What each rank contributed to the gradient collectives per step, mean over the epoch's steps:
  // the allreduce payload (a ring allreduce moves 2 (N - 1) / N of it over each link).
  double gradient_bytes_per_step = 0;
  int64_t optimizer_state_bytes = 0;      // this rank's (1/N of it with distributed.shard_optimizer)
  int64_t peak_resident_bytes = 0;        // the largest rank's peak RSS so far (VmHWM), 0 if unknown
  std::optional<ClippingStats> clipping;  // set where optimizer.max_grad_norm clips
};

struct RunOptions {
  // "" (fresh start), "auto" (the newest valid checkpoint in checkpoint.dir, else a fresh start) or
  // the path of one checkpoint (that one, or fail).
  std::string resume;
  // Called on every rank once the run is set up (model, data, resumed state), before its first step.
  // The trainer program installs its stop handlers here: a signal during the set-up, Open MPI's
  // SIGTERM after a peer's error among them, then ends the process as by default instead of
  // announcing a checkpoint that no step will write.
  std::function<void()> before_first_step;
};

struct TrainingResult {
  std::vector<EpochMetrics> epochs;  // one entry per (partial) epoch
  // Non-empty when a signal stopped the run at a step boundary after its checkpoint was written
  // (trainer/stop_signals.h): "SIGTERM on 1 rank". The process should then exit with
  // kExitStoppedWithCheckpoint.
  std::string stopped_by;
};

struct BenchmarkOptions {
  int64_t warmup_steps = 20;
  int64_t timed_steps = 100;  // per repetition
  int64_t repetitions = 1;
  // Called once the warm-up steps are done, before the first timed one (e.g. to start a profile).
  std::function<void()> before_timed_steps;
  // Horovod's synthetic benchmark: the first step's batch is kept where the model runs and every
  // later step trains on it again, with no gathering and no upload. The same math as loading it
  // again when the rank's data is that one batch, unshuffled and unaugmented (bench/synthetic_benchmark's;
  // Trainer::benchmark refuses any other).
  bool fixed_batch = false;
};

// The median, for an even count the mean of the middle two (as Python's statistics.median, which the
// PyTorch side of the comparisons takes: the upper one alone favoured us when each side timed two
// iterations); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const std::size_t half = values.size() / 2;
  std::ranges::sort(values);
  return values.size() % 2 == 1 ? values[half] : (values[half - 1] + values[half]) / 2;
}

struct BenchmarkResult {
  double samples_per_sec = 0;  // all ranks together, median of the repetitions
  std::vector<double> samples_per_sec_by_repetition;
  StepTimes step_times;            // over all repetitions
  int64_t tensor_allocations = 0;  // fresh tensor buffers during the timed steps (rank 0)
  int64_t parameters = 0;
  std::vector<int64_t> bucket_bytes;  // the gradient buckets, in launch order
  double backward_fraction = 0;       // share of compute spent in backward (what overlap can hide behind)
  // CPU time of the process (every thread: the step's and communication's) per timed step, mean over
  // the ranks. Against step_times.total it separates work from waiting: a rank that waits for a slower
  // peer adds wall time but no CPU time. On a GPU it includes the host's wait for the device, which
  // CUDA may spend spinning.
  double cpu_seconds_per_step = 0;
  // 2 FLOPs x 3 (forward, backward's input and weight gradients) x the model's multiply-adds per
  // sample (layers::Module::multiply_adds), the usual count (it includes the first layer's input
  // gradient, which is not computed: 2.6% of the MNIST CNN's).
  int64_t training_flops_per_sample = 0;
  double mean_loss = 0;  // over the timed steps' samples on all ranks
};

struct Evaluation {
  double loss = 0, accuracy = 0;  // accuracy: classification only
  int64_t correct = 0, samples = 0;
};

}  // namespace dptrain::trainer
