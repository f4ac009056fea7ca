// The trainer's own steps, timed (bench/train_bench and scripts/scaling.sh): no evaluation, no
// checkpoints, the same steps as training.
#include <algorithm>
#include <chrono>
#include <ctime>

#include "core/storage.h"
#include "trainer/trainer.h"

namespace dptrain::trainer {

namespace {

double process_cpu_seconds() {
  timespec now{};
  DPTRAIN_CHECK(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) == 0,
                "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed", " while timing the benchmark's steps");
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

BenchmarkResult Trainer::benchmark(const BenchmarkOptions& options) {
  if (options.fixed_batch) {
    // Training on the first batch again is the same math only when the loader would hand over the
    // same samples, in the same order and unaugmented, at every step.
    const DataConfig& data = config_.data;
    const bool same_batch_every_step = sampler_.steps_per_epoch() == 1 && batches_per_step_ == 1 &&
                                       !deterministic_ && !data.shuffle &&
                                       data.augment.random_crop_padding == 0 && !data.augment.horizontal_flip;
    DPTRAIN_CHECK(same_batch_every_step,
                  "a benchmark with a fixed batch needs the same batch at every step: one batch per rank and "
                  "epoch (data.batch_size x ranks = the dataset's samples), one backward pass a step, "
                  "data.shuffle false, no data.augment, distributed.deterministic false; this run has ",
                  sampler_.steps_per_epoch(), " batch(es) per epoch, backward_passes_per_step ",
                  config_.distributed.backward_passes_per_step, ", shuffle ", data.shuffle ? "true" : "false",
                  ", augment crop ", data.augment.random_crop_padding, " flip ",
                  data.augment.horizontal_flip ? "true" : "false", ", deterministic ",
                  deterministic_ ? "true" : "false",
                  "; hint: time the loader instead (bench/synthetic_benchmark --data-path)");
  }
  // A benchmark that throws leaves the trainer loading batches again.
  struct Unfix {
    bool& fixed;
    ~Unfix() { fixed = false; }
  } unfix{batch_is_fixed_};
  model_->set_training(true);
  int64_t epoch = 0, step = 0, steps = 0;
  const auto next_step = [&](StepTotals& totals) {
    if (step == steps) {
      sampler_.set_epoch(epoch);
      if (!batch_is_fixed_) start_loading(epoch);
      ++epoch;
      steps = optimizer_steps_per_epoch();
      step = 0;
    }
    train_step(epoch, step++, totals);
    batch_is_fixed_ = options.fixed_batch;
  };
  StepTotals warmup, timed;
  for (int64_t i = 0; i < options.warmup_steps; ++i) next_step(warmup);
  flush_metrics(warmup);
  if (options.before_timed_steps) options.before_timed_steps();
  BenchmarkResult result;
  const std::size_t allocations_before = storage_stats().fresh_allocations;
  double timed_seconds = 0, cpu_seconds = 0, all_samples = 0;  // all_samples: every rank's
  for (int64_t r = 0; r < options.repetitions; ++r) {
    comm_->barrier("barrier before the timed steps");
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = process_cpu_seconds();
    const int64_t samples_before = timed.samples;
    for (int64_t i = 0; i < options.timed_steps; ++i) next_step(timed);
    flush_metrics(timed);  // waits for the device: its queued work belongs to these steps
    cpu_seconds += process_cpu_seconds() - cpu_start;  // before the barrier, where MPI polls
    comm_->barrier("barrier after the timed steps");   // the slowest rank sets the time
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    timed_seconds += seconds;
    double samples = static_cast<double>(timed.samples - samples_before);
    comm_->allreduce(std::span<double>(&samples, 1), distributed::ReduceOp::kSum,
                     "allreduce of benchmark samples");
    all_samples += samples;
    result.samples_per_sec_by_repetition.push_back(samples / seconds);
  }
  result.tensor_allocations = static_cast<int64_t>(storage_stats().fresh_allocations - allocations_before);
  result.parameters = layers::parameter_count(*model_);
  result.training_flops_per_sample = 6 * model_->multiply_adds(train_set_->sample_shape());
  result.bucket_bytes = gradient_sync_->bucket_bytes();
  // Sums over the ranks: backward time, forward and backward time, CPU time.
  double sums[3] = {timed.backward, timed.forward + timed.backward, cpu_seconds};
  comm_->allreduce(std::span<double>(sums), distributed::ReduceOp::kSum,
                   "allreduce of the benchmark's times");
  result.backward_fraction = sums[0] / std::max(sums[1], 1e-12);
  distributed::ExactScalarSum loss = timed.loss_sum;
  loss.allreduce(*comm_, "allreduce of the benchmark's loss");
  result.mean_loss = loss.value() / std::max(all_samples, 1.0);
  result.step_times = mean_step_times(timed, timed_seconds);
  const int64_t timed_steps = std::max<int64_t>(options.timed_steps * options.repetitions, 1);
  result.cpu_seconds_per_step = sums[2] / comm_->size() / static_cast<double>(timed_steps);
  result.samples_per_sec = median(result.samples_per_sec_by_repetition);
  if (!config_.distributed.timeline.empty()) write_timeline(*comm_, config_.distributed.timeline);
  return result;
}

}  // namespace dptrain::trainer
