// The optimizer step, top to bottom, the same for every mode and gradient sync:
//   plan (this rank's micro-batches) -> for each: batch -> forward -> loss -> backward
//     (the gradient sync's hooks around it: buckets launch as gradients become ready)
//   -> gradient sync finishes (the gradients are the average over all ranks) -> clipping -> optimizer
//   -> gradient sync after the update (a sharded optimizer's parameters all-gathered) -> position
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/ops.h"
#include "distributed/shard_layout.h"
#include "optim/clip.h"
#include "trainer/phase.h"
#include "trainer/trainer.h"

namespace dptrain::trainer {

void Trainer::train_step(int64_t epoch, int64_t step_in_epoch, StepTotals& totals) {
  const StepPlan& plan = plan_step(step_in_epoch);
  // The schedule runs on samples, not steps, so a resume on another world size keeps its place.
  lr_ = schedule_->at(static_cast<double>(epoch - 1) +
                      static_cast<double>(plan.samples_before) / sampler_.dataset_size());
  optimizer_->zero_grad();
  if (buffers_follow_rank0()) {
    Phase phase(totals.communication, "broadcast of buffers");
    broadcast_buffers_from_rank0();
  }
  const int64_t micro_batch_count = static_cast<int64_t>(plan.micro_batches.size());
  gradient_sync_->begin_step({.step = position_.global_step,
                              .micro_batches = micro_batch_count,
                              .global_micro_batches = plan.global_micro_batches});
  for (int64_t i = 0; i < micro_batch_count; ++i) {
    const MicroBatch& micro_batch = plan.micro_batches[static_cast<std::size_t>(i)];
    if (!batch_is_fixed_) {
      Phase phase(totals.data, "data");
      load_batch(*train_loader_, micro_batch.indices);
    }
    model_->reseed(micro_batch.dropout_seed);
    Tensor output, loss;
    {
      Phase phase(totals.forward, "forward");
      output = model_->forward(batch_.inputs);
      loss = loss_of(output);
    }
    {
      Phase phase(totals.backward, "backward");
      gradient_sync_->before_backward(i);
      loss.backward(micro_batch.loss_scale);
      gradient_sync_->after_backward(i);
    }
    count_batch(output, loss, totals);
  }
  {
    Phase phase(totals.communication, "finish gradient averaging");
    gradient_sync_->finish_step();
  }
  float grad_scale = 1.0f;
  if (config_.optimizer.max_grad_norm > 0) {
    Phase phase(totals.optimizer, "gradient clipping");
    const double norm = averaged_gradient_norm();
    grad_scale = optim::clip_factor(norm, config_.optimizer.max_grad_norm);
    totals.clipping.add(norm, grad_scale < 1.0f);
  }
  {
    Phase phase(totals.optimizer, "optimizer");
    optimizer_->step(static_cast<float>(lr_), grad_scale);
  }
  // A sharded optimizer updated this rank's part of the parameters: the rest comes from the others.
  if (gradient_sync_->optimizer_shard() != nullptr) {
    Phase phase(totals.communication, "all-gather of parameters");
    gradient_sync_->after_update();
  }
  // Bookkeeping, before the step count moves on (a payload can depend on the step: PowerSGD's).
  if (world_.size() > 1) totals.payload_bytes += gradient_sync_->payload_bytes(position_.global_step);
  // What the sync did from inside backward's hooks (compression, the last bucket) is communication.
  const double in_backward = gradient_sync_->take_seconds_in_backward();
  totals.backward -= in_backward;
  totals.communication += in_backward;
  position_.samples_seen += plan.samples_after - plan.samples_before;
  position_.epoch_samples_done = plan.samples_after;
  position_.optimizer_steps = optimizer_->steps_taken();
  ++position_.global_step;
  ++totals.steps;
}

// The global L2 norm of the averaged gradients, which optimizer.max_grad_norm clips. A sharded
// optimizer's rank holds the average only in its chunks (and the tails, which every rank holds): each
// rank sums its chunks, rank 0 the tails too, and the ranks add their sums.
double Trainer::averaged_gradient_norm() {
  const distributed::ShardLayout* shard = gradient_sync_->optimizer_shard();
  double norm = 0;
  if (shard == nullptr) {
    const std::vector<FlatRange> whole{{0, parameters_->size()}};
    norm = std::sqrt(optim::gradient_sum_of_squares(*parameters_, whole));
  } else {
    std::vector<FlatRange> counted;
    for (std::size_t w = 0; w < shard->windows(); ++w) {
      counted.push_back(shard->chunk_of(w, world_.rank()));
      if (world_.is_root()) counted.push_back(shard->tail(w));
    }
    double squares = optim::gradient_sum_of_squares(*parameters_, counted);
    comm_->allreduce(std::span<double>(&squares, 1), distributed::ReduceOp::kSum,
                     "sum of the squared gradients (optimizer.max_grad_norm) at step " +
                         std::to_string(position_.global_step));
    norm = std::sqrt(squares);
  }
  return norm;
}

// Step `step_in_epoch` of the current epoch on this rank. In deterministic mode each micro-batch has the same
// shapes and kernels whichever rank runs it, and its dropout masks follow its place in the step's
// global order, so with the exact sum the update has the same bits for any number of ranks.
const Trainer::StepPlan& Trainer::plan_step(int64_t step_in_epoch) {
  StepPlan& plan = plan_;
  plan.micro_batches.clear();
  if (!deterministic_) {
    const int64_t first = step_in_epoch * batches_per_step_;
    const int64_t passes = std::min(batches_per_step_, sampler_.steps_per_epoch() - first);
    const float scale = 1.0f / static_cast<float>(passes * gradient_sync_->ranks_in_average());
    for (int64_t pass = 0; pass < passes; ++pass)
      plan.micro_batches.push_back({sampler_.batch_indices(first + pass), scale, dropout_seed_of_pass(pass)});
    plan.global_micro_batches = passes * world_.size();
    plan.samples_before = sampler_.samples_before(first);
    plan.samples_after = sampler_.samples_before(first + passes);
    return plan;
  }
  plan.samples_before = sampler_.samples_before(step_in_epoch);
  plan.samples_after = sampler_.samples_before(step_in_epoch + 1);
  const double step_samples = static_cast<double>(plan.samples_after - plan.samples_before);
  int64_t i = 0;
  for (const std::span<const int64_t> indices : micro_batches_of(sampler_.batch_indices(step_in_epoch)))
    plan.micro_batches.push_back(
        {indices, static_cast<float>(static_cast<double>(indices.size()) / step_samples),
         dropout_seed_of_micro_batch(sampler_.first_micro_batch(step_in_epoch) + i++)});
  plan.global_micro_batches = sampler_.micro_batches(step_in_epoch);
  return plan;
}

// Deterministic mode cuts this rank's share of a step into micro-batches of fixed size (the last may
// be shorter); regular mode's micro-batch is the sampler's batch.
std::vector<std::span<const int64_t>> Trainer::micro_batches_of(std::span<const int64_t> batch) const {
  if (!deterministic_) return {batch};
  const int64_t size = static_cast<int64_t>(batch.size()),
                micro = config_.distributed.deterministic_micro_batch;
  std::vector<std::span<const int64_t>> out;
  for (int64_t first = 0; first < size; first += micro)
    out.push_back(batch.subspan(static_cast<std::size_t>(first),
                                static_cast<std::size_t>(std::min(micro, size - first))));
  return out;
}

// The steps take the sampler's batches in order, each as its micro-batches: the loader reads ahead
// along that list.
void Trainer::start_loading(int64_t sampler_epoch) {
  std::vector<std::span<const int64_t>> batches;
  for (int64_t k = 0; k < sampler_.steps_per_epoch(); ++k)
    for (const std::span<const int64_t> micro_batch : micro_batches_of(sampler_.batch_indices(k)))
      batches.push_back(micro_batch);
  train_loader_->start(sampler_epoch, std::move(batches));
}

// Dropout masks follow from (seed, rank, step, pass): a resumed run draws the same ones.
uint64_t Trainer::dropout_seed_of_pass(int64_t pass) const {
  return derive_seed(config_.seed, "dropout/rank" + std::to_string(world_.rank()) + "/step" +
                                       std::to_string(position_.global_step) + "/pass" +
                                       std::to_string(pass));
}

// In deterministic mode the masks follow the micro-batch (its place in the step's global order),
// not the rank that runs it.
uint64_t Trainer::dropout_seed_of_micro_batch(int64_t global_micro_batch) const {
  return derive_seed(config_.seed, "dropout/step" + std::to_string(position_.global_step) + "/micro" +
                                       std::to_string(global_micro_batch));
}

Tensor Trainer::loss_of(const Tensor& output) const {
  return config_.model.loss == LossKind::kMse ? ops::mse(output, batch_.targets)
                                              : ops::cross_entropy(output, batch_.labels);
}

void Trainer::count_batch(const Tensor& output, const Tensor& loss, StepTotals& totals) {
  train_metrics_->add(loss, output, batch_.labels, totals.loss_sum, totals.correct);
  totals.samples += output.dim(0);
}

void Trainer::flush_metrics(StepTotals& totals, bool check_gradients) {
  train_metrics_->flush(totals.loss_sum, totals.correct);
  if (check_gradients) gradient_sync_->check_deferred();
}

// The loader's batch copied into tensors of the run's device: on a GPU straight from the loader's
// slot, page-locked memory that the upload reads in place while the step before still runs
// (Backend::allocate_host, Backend::upload).
// Host buffers come from the storage cache, so steady-state steps do not allocate.
void Trainer::load_batch(data::BatchLoader& loader, std::span<const int64_t> indices) {
  const data::BatchView batch = loader.take();
  const int64_t n = batch.samples, width = loader.dataset().target_width();
  DPTRAIN_CHECK(n == static_cast<int64_t>(indices.size()), "the loader's batch has ", n,
                " samples where the step expects ", indices.size());
  Shape shape{n};
  const Shape& sample = loader.dataset().sample_shape();
  shape.insert(shape.end(), sample.begin(), sample.end());
  batch_.labels.assign(batch.labels.begin(), batch.labels.end());
  batch_.inputs = Tensor::from_host(shape, batch.inputs, device_);
  batch_.targets = width > 0 ? Tensor::from_host({n, width}, batch.targets, device_) : Tensor();
}

// Each rank reports its own: which files are bad differs with the shard a rank reads.
void Trainer::report_bad_samples(data::BatchLoader& loader, const std::string& where) const {
  const data::BadSampleCount bad = loader.take_bad_samples();
  if (bad.samples == 0) return;
  std::fprintf(stderr,
               "dptrain: rank %d: warning: %lld bad sample(s) replaced by the next good one in %s "
               "(data.on_bad_sample \"skip\"); the first: %s\n",
               world_.rank(), static_cast<long long>(bad.samples), where.c_str(), bad.first.c_str());
}

}  // namespace dptrain::trainer
