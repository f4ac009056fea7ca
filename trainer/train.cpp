// The training loop, top to bottom. One optimizer step:
//   sampler -> batch -> forward (the tape records) -> loss -> backward
//     -> as each gradient bucket fills: [compress] -> allreduce (async) -> ... wait all -> average
//     -> optimizer.step(lr from the schedule) -> metrics
// Before the first step every rank takes rank 0's parameters, optimizer state and position (fresh,
// or read from a checkpoint by rank 0 alone); rank 0 writes checkpoints as training goes.
#include "trainer/train.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/storage.h"
#include "core/timeline.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "distributed/communicator.h"
#include "distributed/reducer.h"
#include "distributed/state_sync.h"
#include "layers/build.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "trainer/checkpoint.h"
#include "trainer/progress.h"

namespace dptrain::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU threads per rank: the configured number, or this host's cores shared among its ranks.
int choose_threads(int configured, const distributed::World& world) {
  if (configured > 0) return configured;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / world.local_size());
}

data::Dataset load_dataset(const Config& c, bool train) {
  if (c.data.dataset == "linear") {
    const LinearDataConfig& l = c.data.linear;
    return data::make_linear_dataset(train ? l.samples : l.test_samples, l.coefficients, l.noise,
                                     c.seed + (train ? 0 : 1));
  }
  data::Dataset ds = data::load_image_dataset(c.data.dir, train, static_cast<float>(c.data.mean),
                                              static_cast<float>(c.data.std));
  data::keep_first(ds, train ? c.data.max_train_samples : c.data.max_test_samples);
  return ds;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizerConfig& o,
                                                 std::vector<NamedTensor> parameters) {
  if (o.type == "sgd") {
    return std::make_unique<optim::Sgd>(
        std::move(parameters),
        optim::SgdOptions{static_cast<float>(o.momentum), static_cast<float>(o.dampening), o.nesterov,
                          static_cast<float>(o.weight_decay)});
  }
  return std::make_unique<optim::Adam>(
      std::move(parameters),
      optim::AdamOptions{static_cast<float>(o.betas[0]), static_cast<float>(o.betas[1]),
                         static_cast<float>(o.eps), static_cast<float>(o.weight_decay), o.type == "adamw"});
}

// A batch as tensors; buffers come from the storage cache, so steady-state steps do not allocate.
struct Batch {
  Tensor inputs;
  std::vector<int32_t> labels;
  Tensor targets;  // regression only
};

void fill_batch(const data::Dataset& ds, std::span<const int64_t> indices, Batch& batch) {
  const int64_t n = static_cast<int64_t>(indices.size());
  Shape shape{n};
  shape.insert(shape.end(), ds.sample_shape.begin(), ds.sample_shape.end());
  batch.inputs = Tensor::empty(shape);
  batch.labels.resize(indices.size());
  const bool regression = !ds.targets.empty();
  if (regression) batch.targets = Tensor::empty({n, static_cast<int64_t>(ds.targets.size()) / ds.size});
  data::gather_batch(ds, indices, batch.inputs.data(), batch.labels.data(),
                     regression ? batch.targets.data() : nullptr);
}

int64_t count_correct(const Tensor& logits, std::span<const int32_t> labels) {
  int64_t correct = 0;
  const int64_t classes = logits.dim(1);
  for (std::size_t b = 0; b < labels.size(); ++b) {
    const float* row = logits.data() + b * classes;
    correct += (std::max_element(row, row + classes) - row) == labels[b];
  }
  return correct;
}

// DPTRAIN_INJECT_FAULT=RANK:STEP[:KIND] makes that rank fail when `STEP` optimizer steps are done:
//   throw (default)     throws before the next step: "one rank fails, the whole job stops"
//   kill                SIGKILLs itself there: a job killed between two checkpoints
//   kill_in_checkpoint  rank 0 SIGKILLs itself half-way through writing that step's checkpoint
// The tests of those guarantees use it; unset in normal use.
struct InjectedFault {
  enum class Kind { kThrow, kKill, kKillInCheckpoint };
  int rank = -1;
  int64_t step = -1;
  Kind kind = Kind::kThrow;
};
InjectedFault injected_fault() {
  InjectedFault f;
  const char* spec = std::getenv("DPTRAIN_INJECT_FAULT");
  if (spec == nullptr || *spec == '\0') return f;
  char kind[32] = "throw";
  const int fields = std::sscanf(spec, "%d:%ld:%31s", &f.rank, &f.step, kind);
  const std::string k = kind;
  DPTRAIN_CHECK((fields == 2 || fields == 3) && (k == "throw" || k == "kill" || k == "kill_in_checkpoint"),
                "DPTRAIN_INJECT_FAULT='", spec, "': expected RANK:STEP[:throw|kill|kill_in_checkpoint]");
  f.kind = k == "kill"                 ? InjectedFault::Kind::kKill
           : k == "kill_in_checkpoint" ? InjectedFault::Kind::kKillInCheckpoint
                                       : InjectedFault::Kind::kThrow;
  return f;
}

// Adds the duration of a scope to a counter and, when the timeline is on, records it as a span.
class Phase {
 public:
  Phase(double& seconds, const char* name) : seconds_(seconds), span_(name, "step") {}
  ~Phase() { seconds_ += seconds_since(start_); }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  double& seconds_;
  timeline::Span span_;
  Clock::time_point start_ = Clock::now();
};

std::string megabytes(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return text;
}

class Trainer {
 public:
  Trainer(const Config& config, const distributed::World& world)
      : config_(config),
        world_(world),
        comm_(MPI_COMM_WORLD, {config.distributed.stall_warning_s, config.distributed.stall_abort_s}),
        train_set_(load_dataset(config, true)),
        test_set_(load_dataset(config, false)),
        sampler_(train_set_.size, config.data.batch_size, world.rank(), world.size(), config.seed,
                 config.data.shuffle, config.data.drop_last),
        passes_per_step_(config.distributed.backward_passes_per_step),
        progress_(world.is_root(), config.training.progress, config.training.log_every_steps),
        fault_(injected_fault()) {
    DPTRAIN_CHECK(config.model.input_shape == train_set_.sample_shape,
                  "config key model.input_shape = ", shape_str(config.model.input_shape),
                  " does not match the samples of data.dataset \"", config.data.dataset, "\" (",
                  shape_str(train_set_.sample_shape), ")");
    DPTRAIN_CHECK(config.model.loss == "mse" || train_set_.targets.empty(), "data.dataset \"",
                  config.data.dataset, "\" is a regression dataset; set model.loss to \"mse\"");
    DPTRAIN_CHECK(config.model.loss == "cross_entropy" || !train_set_.targets.empty(),
                  "model.loss \"mse\" needs a ",
                  "regression dataset (data.dataset \"linear\"); use \"cross_entropy\" for classes");
    DPTRAIN_CHECK(sampler_.steps_per_epoch() > 0, "data.batch_size ", config.data.batch_size, " x ",
                  world.size(), " ranks is larger than the ", train_set_.size,
                  " training samples with data.drop_last");
    DPTRAIN_CHECK(train_set_.size >= world.size(), "only ", train_set_.size, " training samples for ",
                  world.size(), " ranks: every rank needs at least one sample per step");

    model_ = layers::build_sequential(config.model.layers, config.model.input_shape, config.seed);
    optimizer_ = make_optimizer(config.optimizer, model_->named_parameters());
    schedule_ = std::make_unique<optim::LrSchedule>(optim::ScheduleOptions{
        config.optimizer.lr, config.optimizer.lr_scaling, world.size(), static_cast<int>(passes_per_step_),
        config.optimizer.warmup_epochs, config.optimizer.schedule, config.optimizer.step_size_epochs,
        config.optimizer.gamma, static_cast<double>(config.training.epochs), config.optimizer.min_lr});
    reducer_ = std::make_unique<distributed::GradientReducer>(
        comm_, model_->named_parameters(),
        distributed::ReducerOptions{config.distributed.fusion_threshold_mb,
                                    config.distributed.first_bucket_mb, config.distributed.overlap,
                                    distributed::parse_compression(config.distributed.compression),
                                    /*gradients_prescaled=*/true, config.distributed.check_finite});
  }

  // Rank 0 alone reads files (checkpoint or init_from), so no shared filesystem is needed; then all
  // ranks take rank 0's parameters, optimizer state and position, whatever they initialised.
  void start(const RunOptions& options) {
    if (world_.is_root()) {
      if (!options.resume.empty()) resume(options.resume);
      if (!config_.model.init_from.empty() && !resumed_) init_from(config_.model.init_from);
    }
    position_.optimizer_steps = optimizer_->steps_taken();
    int64_t scalars[] = {position_.optimizer_steps, position_.epochs_completed, position_.epoch_samples_done,
                         position_.global_step,     position_.samples_seen,     resumed_};
    distributed::broadcast_state(comm_, optimizer_->parameters(), optimizer_->state(),
                                 std::span<int64_t>(scalars));
    position_ = {scalars[1], scalars[2], scalars[3], scalars[4], scalars[0]};
    resumed_ = scalars[5] != 0;
    optimizer_->set_steps_taken(position_.optimizer_steps);
    checksum_ = distributed::verify_identical(comm_, optimizer_->parameters());
    if (!config_.distributed.timeline.empty()) {
      comm_.barrier("barrier before the timeline starts");  // lines the ranks' tracks up
      timeline::enable();
    }
  }

  std::vector<EpochMetrics> run() {
    if (world_.is_root() && !resumed_) clear_earlier_checkpoints();
    announce();
    std::vector<EpochMetrics> history;
    std::ofstream metrics = open_metrics();
    for (int64_t epoch = position_.epochs_completed + 1;
         epoch <= config_.training.epochs && !step_limit_reached(); ++epoch) {
      EpochMetrics m = train_epoch(epoch);
      const Evaluation e = evaluate();
      m.test_loss = e.loss;
      m.test_accuracy = e.accuracy;
      history.push_back(m);
      if (world_.is_root()) {
        report(m);
        write_metrics(metrics, m);
      }
      const CheckpointConfig& k = config_.checkpoint;
      const bool epoch_due = k.every_epochs > 0 && epoch % k.every_epochs == 0 && !m.stopped_early;
      const bool step_due = k.every_steps > 0 && position_.global_step % k.every_steps == 0;
      if (epoch_due || step_due) save_checkpoint();
    }
    if (last_checkpoint_step_ != position_.global_step) save_checkpoint();  // always one at the end
    if (world_.is_root()) save_final_weights();
    write_timeline();
    return history;
  }

  Evaluation evaluate_only(const std::string& path) {
    if (world_.is_root()) {
      const Checkpoint c = read_checkpoint(path);
      restore(c, model_->named_parameters(), nullptr);
    }
    int64_t none = 0;
    distributed::broadcast_state(comm_, model_->named_parameters(), {}, std::span<int64_t>(&none, 1));
    const Evaluation e = evaluate();
    if (world_.is_root()) {
      if (config_.model.loss == "mse") {
        std::printf("evaluation of %s: test loss %.6g (%lld samples, %d rank(s))\n", path.c_str(), e.loss,
                    static_cast<long long>(e.samples), world_.size());
      } else {
        std::printf("evaluation of %s: test loss %.4f, accuracy %.2f%% (%lld of %lld correct, %d rank(s))\n",
                    path.c_str(), e.loss, 100 * e.accuracy, static_cast<long long>(e.correct),
                    static_cast<long long>(e.samples), world_.size());
      }
      std::fflush(stdout);
    }
    return e;
  }

  BenchmarkResult benchmark(const BenchmarkOptions& options) {
    model_->set_training(true);
    int64_t epoch = 0, step = 0, steps = 0;
    const auto next_step = [&](StepTotals& totals) {
      if (step == steps) {
        sampler_.set_epoch(epoch++);
        steps = (sampler_.steps_per_epoch() + passes_per_step_ - 1) / passes_per_step_;
        step = 0;
      }
      train_step(epoch, step++, totals);
    };
    StepTotals warmup, timed;
    for (int64_t i = 0; i < options.warmup_steps; ++i) next_step(warmup);
    BenchmarkResult result;
    const std::size_t allocations_before = storage_stats().fresh_allocations;
    double timed_seconds = 0;
    for (int64_t r = 0; r < options.repetitions; ++r) {
      comm_.barrier("barrier before the timed steps");
      const auto start = Clock::now();
      const int64_t samples_before = timed.samples;
      for (int64_t i = 0; i < options.timed_steps; ++i) next_step(timed);
      comm_.barrier("barrier after the timed steps");  // the slowest rank sets the time
      const double seconds = seconds_since(start);
      timed_seconds += seconds;
      double samples = static_cast<double>(timed.samples - samples_before);
      comm_.allreduce(std::span<double>(&samples, 1), distributed::ReduceOp::kSum,
                      "allreduce of benchmark samples");
      result.samples_per_sec_by_repetition.push_back(samples / seconds);
    }
    result.tensor_allocations = static_cast<int64_t>(storage_stats().fresh_allocations - allocations_before);
    result.parameters = layers::parameter_count(*model_);
    for (const distributed::Bucket& b : reducer_->buckets())
      result.bucket_bytes.push_back(b.numel * static_cast<int64_t>(sizeof(float)));
    double backward[2] = {timed.backward, timed.forward + timed.backward};
    comm_.allreduce(std::span<double>(backward), distributed::ReduceOp::kSum, "allreduce of backward time");
    result.backward_fraction = backward[0] / std::max(backward[1], 1e-12);
    result.step_times = mean_step_times(timed, timed_seconds);
    std::vector<double> sorted = result.samples_per_sec_by_repetition;
    std::sort(sorted.begin(), sorted.end());
    result.samples_per_sec = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
    write_timeline();
    return result;
  }

 private:
  bool step_limit_reached() const {
    return config_.training.max_steps > 0 && position_.global_step >= config_.training.max_steps;
  }

  // Running sums over the steps of an epoch (or of a benchmark), this rank only.
  struct StepTotals {
    double loss_sum = 0;
    int64_t correct = 0, samples = 0, steps = 0;
    double data = 0, forward = 0, backward = 0, communication = 0, optimizer = 0;  // seconds
  };

  EpochMetrics train_epoch(int64_t epoch) {
    const int64_t first_sample = epoch == position_.epochs_completed + 1 ? position_.epoch_samples_done : 0;
    sampler_.set_epoch(epoch - 1, first_sample);
    model_->set_training(true);
    const int64_t batches = sampler_.steps_per_epoch();
    const int64_t steps = (batches + passes_per_step_ - 1) / passes_per_step_;
    progress_.begin_epoch(epoch, config_.training.epochs, steps);
    StepTotals totals;
    const auto start = Clock::now();
    int64_t step = 0;
    for (; step < steps && !step_limit_reached(); ++step) {
      inject_fault_before_step();
      train_step(epoch, step, totals);
      progress_.update(
          step, totals.loss_sum / totals.samples,
          config_.model.loss == "mse" ? -1.0 : static_cast<double>(totals.correct) / totals.samples,
          totals.samples * world_.size() / seconds_since(start));
      // A checkpoint due at an epoch's last step waits for the evaluation (run() writes it).
      const int64_t every = config_.checkpoint.every_steps;
      if (every > 0 && position_.global_step % every == 0 && step + 1 < steps && !step_limit_reached())
        save_checkpoint();
    }
    progress_.end_epoch();
    if (step == steps) {
      position_.epochs_completed = epoch;
      position_.epoch_samples_done = 0;
    }

    EpochMetrics m;
    m.epoch = epoch;
    m.step = position_.global_step;
    m.lr = lr_;
    m.epoch_seconds = seconds_since(start);
    m.first_sample = first_sample;
    m.step_times = mean_step_times(totals, m.epoch_seconds);
    // Weighted by sample counts: ranks may hold different batch sizes in an epoch's last step.
    double sums[3] = {totals.loss_sum, static_cast<double>(totals.correct),
                      static_cast<double>(totals.samples)};
    comm_.allreduce(std::span<double>(sums), distributed::ReduceOp::kSum, "allreduce of epoch metrics");
    m.train_loss = sums[0] / std::max(sums[2], 1.0);
    m.train_accuracy = sums[1] / std::max(sums[2], 1.0);
    m.samples_per_sec = sums[2] / m.epoch_seconds;
    m.samples_per_sec_per_rank = m.samples_per_sec / world_.size();
    m.stopped_early = step < steps;
    return m;
  }

  // --- one optimizer step: step `step` of the current epoch (backward_passes_per_step batches) ---
  void train_step(int64_t epoch, int64_t step, StepTotals& totals) {
    const int64_t batches = sampler_.steps_per_epoch();
    const int64_t first_batch = step * passes_per_step_;
    const int64_t passes = std::min(passes_per_step_, batches - first_batch);
    // The schedule runs on samples, not steps, so a resume on another world size keeps its place.
    lr_ = schedule_->at(static_cast<double>(epoch - 1) +
                        static_cast<double>(sampler_.samples_before(first_batch)) / sampler_.dataset_size());

    optimizer_->zero_grad();
    for (int64_t pass = 0; pass < passes; ++pass) {
      {
        Phase phase(totals.data, "data");
        fill_batch(train_set_, sampler_.batch_indices(first_batch + pass), batch_);
      }
      model_->reseed(dropout_stream(pass));
      Tensor output, loss;
      {
        Phase phase(totals.forward, "forward");
        output = model_->forward(batch_.inputs);
        loss = config_.model.loss == "mse" ? ops::mse(output, batch_.targets)
                                           : ops::cross_entropy(output, batch_.labels);
      }
      if (pass == passes - 1)
        reducer_->prepare(position_.global_step);  // buckets launch during this backward
      {
        // The step averages its passes and the ranks: seeding backward with 1 / (passes x ranks)
        // makes the allreduce's sum the average, with no extra pass over the gradients.
        Phase phase(totals.backward, "backward");
        loss.backward(1.0f / static_cast<float>(passes * world_.size()));
      }
      const int64_t n = batch_.inputs.dim(0);
      totals.loss_sum += static_cast<double>(loss.item()) * n;
      if (config_.model.loss == "cross_entropy") totals.correct += count_correct(output, batch_.labels);
      totals.samples += n;
    }
    {
      Phase phase(totals.communication, "finish gradient averaging");
      reducer_->finish();  // gradients are now the average over all ranks
    }
    // Buckets reduced from inside backward (compression, the last bucket) count as communication.
    const double in_backward = reducer_->take_times().in_backward_s;
    totals.backward -= in_backward;
    totals.communication += in_backward;
    {
      Phase phase(totals.optimizer, "optimizer");
      optimizer_->step(static_cast<float>(lr_));
    }

    const int64_t done = sampler_.samples_before(first_batch + passes);
    position_.samples_seen += done - sampler_.samples_before(first_batch);
    position_.epoch_samples_done = done;
    position_.optimizer_steps = optimizer_->steps_taken();
    ++position_.global_step;
    ++totals.steps;
  }

  // Per-step means over all ranks' steps; `wall_seconds` is this rank's time for its totals.steps.
  StepTimes mean_step_times(const StepTotals& t, double wall_seconds) {
    double sums[6] = {t.data,      t.forward + t.backward, t.communication,
                      t.optimizer, wall_seconds,           static_cast<double>(t.steps)};
    comm_.allreduce(std::span<double>(sums), distributed::ReduceOp::kSum, "allreduce of step times");
    const double per_step = 1.0 / std::max(sums[5], 1.0);
    return {sums[0] * per_step, sums[1] * per_step, sums[2] * per_step, sums[3] * per_step,
            sums[4] * per_step};
  }

  // Dropout masks follow from (seed, rank, step, pass): a resumed run draws the same ones.
  uint64_t dropout_stream(int64_t pass) const {
    return derive_seed(config_.seed, "dropout/rank" + std::to_string(world_.rank()) + "/step" +
                                         std::to_string(position_.global_step) + "/pass" +
                                         std::to_string(pass));
  }

  // Each rank evaluates a contiguous slice of the test set; the sums are combined across ranks.
  Evaluation evaluate() {
    timeline::Span span("evaluate", "evaluate");
    NoGradGuard no_grad;
    model_->set_training(false);
    const int64_t n = test_set_.size, r = world_.rank(), size = world_.size();
    const int64_t begin = n * r / size, end = n * (r + 1) / size;
    const bool mse = config_.model.loss == "mse";
    double loss_sum = 0, correct = 0;
    std::vector<int64_t> indices;
    for (int64_t first = begin; first < end; first += config_.data.eval_batch_size) {
      const int64_t last = std::min(end, first + config_.data.eval_batch_size);
      indices.resize(last - first);
      for (int64_t i = first; i < last; ++i) indices[i - first] = i;
      fill_batch(test_set_, indices, batch_);
      Tensor output = model_->forward(batch_.inputs);
      Tensor loss = mse ? ops::mse(output, batch_.targets) : ops::cross_entropy(output, batch_.labels);
      loss_sum += static_cast<double>(loss.item()) * (last - first);
      if (!mse) correct += static_cast<double>(count_correct(output, batch_.labels));
    }
    double totals[2] = {loss_sum, correct};
    comm_.allreduce(std::span<double>(totals), distributed::ReduceOp::kSum,
                    "allreduce of evaluation metrics");
    Evaluation e;
    e.loss = totals[0] / n;
    e.correct = static_cast<int64_t>(totals[1]);
    e.samples = n;
    e.accuracy = mse ? 0.0 : totals[1] / n;
    return e;
  }

  // --- checkpoints (rank 0) ---

  // Loads `which` ("auto" or a path) into the model, optimizer and position_.
  void resume(const std::string& which) {
    const auto accept = [&](const Checkpoint& c) {
      DPTRAIN_CHECK(c.position.epoch_samples_done < train_set_.size, c.path, ": its position (sample ",
                    c.position.epoch_samples_done, " of epoch ", c.position.epochs_completed + 1,
                    ") lies beyond the ", train_set_.size, " training samples configured now");
      const std::vector<NamedTensor> state = optimizer_->state();
      restore(c, optimizer_->parameters(), &state);
    };
    std::optional<Checkpoint> found;
    if (which == "auto") {
      const std::string& dir = config_.checkpoint.dir;
      std::vector<std::string> rejected;
      found = newest_valid_checkpoint(dir, accept, [&](const std::string& path, const std::string& reason) {
        std::fprintf(stderr, "dptrain: skipping checkpoint: %s\n", reason.c_str());
        rejected.push_back(path);
      });
      if (!found) {
        // Starting afresh would let the new run's checkpoints mix with these.
        DPTRAIN_CHECK(rejected.empty(), "--resume auto: none of the ", rejected.size(), " checkpoint(s) in ",
                      dir,
                      " can be used (reasons above); move them away or set checkpoint.dir to start afresh");
        std::printf("dptrain: --resume auto: no checkpoint in %s; starting fresh\n", dir.c_str());
        return;
      }
    } else {
      found = read_checkpoint(which);
      accept(*found);
    }
    const Checkpoint& c = *found;
    position_ = c.position;
    optimizer_->set_steps_taken(c.position.optimizer_steps);
    resumed_ = true;
    const std::string written = c.meta("world_size") + " rank(s) x batch " + c.meta("batch_size");
    const std::string now =
        std::to_string(world_.size()) + " rank(s) x batch " + std::to_string(config_.data.batch_size);
    std::printf("dptrain: resuming from %s: step %lld, epoch %lld at sample %lld of %lld (written on %s%s)\n",
                c.path.c_str(), static_cast<long long>(c.position.global_step),
                static_cast<long long>(c.position.epochs_completed + 1),
                static_cast<long long>(c.position.epoch_samples_done),
                static_cast<long long>(train_set_.size), written.c_str(),
                written == now ? "" : (", now " + now + ": same samples, lr rescaled").c_str());
    last_checkpoint_step_ = c.position.global_step;
  }

  // model.init_from: weights only, from a checkpoint (validated) or a plain safetensors file.
  void init_from(const std::string& path) {
    safetensors::File file = safetensors::load(path);
    if (file.metadata.contains("dptrain_checkpoint_version")) {
      restore(validate_checkpoint(std::move(file), path), model_->named_parameters(), nullptr);
    } else {
      layers::load_parameters(*model_, file, path);
    }
  }

  void clear_earlier_checkpoints() {
    const std::vector<std::string> earlier = list_checkpoints(config_.checkpoint.dir);
    if (earlier.empty()) return;
    // A fresh run owns its output: left in place, an earlier run's higher-step checkpoints would be
    // what --resume auto picks later.
    for (const std::string& path : earlier) std::filesystem::remove(path);
    std::printf(
        "dptrain: starting fresh: removed %zu checkpoint(s) of an earlier run from %s (--resume auto "
        "continues one instead)\n",
        earlier.size(), config_.checkpoint.dir.c_str());
  }

  void save_checkpoint() {
    last_checkpoint_step_ = position_.global_step;
    if (!world_.is_root()) return;
    timeline::Span span("checkpoint", "checkpoint");
    const auto start = Clock::now();
    const Json sampler = {{"seed", config_.seed},
                          {"shuffle", config_.data.shuffle},
                          {"drop_last", config_.data.drop_last},
                          {"dataset_size", train_set_.size},
                          {"epoch", position_.epochs_completed},
                          {"first_sample", position_.epoch_samples_done}};
    const Json rng = {{"seed", config_.seed},
                      {"dropout", "reseeded each pass from (seed, rank, global_step, pass); no stored state"},
                      {"initialisation", "from (seed, parameter name)"}};
    CheckpointData data{optimizer_->parameters(),
                        optimizer_->state(),
                        position_,
                        {{"producer", "dptrain"},
                         {"world_size", std::to_string(world_.size())},
                         {"batch_size", std::to_string(config_.data.batch_size)},
                         {"backward_passes_per_step", std::to_string(passes_per_step_)},
                         {"optimizer", config_.optimizer.type},
                         {"lr", std::to_string(lr_)},
                         {"sampler", sampler.dump()},
                         {"rng", rng.dump()},
                         {"config", to_json(config_).dump()}}};
    const std::vector<char> bytes = encode_checkpoint(data);
    std::filesystem::create_directories(config_.checkpoint.dir);
    const std::string path = config_.checkpoint.dir + "/" + checkpoint_file_name(position_.global_step);
    const bool die_midway = fault_.kind == InjectedFault::Kind::kKillInCheckpoint &&
                            fault_.step == position_.global_step && fault_.rank == world_.rank();
    write_file_durably(path, bytes, [&] {
      if (die_midway) std::raise(SIGKILL);
    });
    prune_checkpoints(config_.checkpoint.dir, config_.checkpoint.keep);
    char line[512];
    std::snprintf(line, sizeof line, "checkpoint: %s (%s, %.1f ms)", path.c_str(),
                  megabytes(bytes.size()).c_str(), 1e3 * seconds_since(start));
    progress_.note(line);
  }

  void inject_fault_before_step() {
    if (position_.global_step != fault_.step || world_.rank() != fault_.rank) return;
    if (fault_.kind == InjectedFault::Kind::kThrow)
      DPTRAIN_FAIL("fault injected by DPTRAIN_INJECT_FAULT at step ", position_.global_step);
    if (fault_.kind == InjectedFault::Kind::kKill) std::raise(SIGKILL);
  }

  // --- output ---

  void announce() {
    if (!world_.is_root()) return;
    std::printf(
        "dptrain: %d rank(s), %d thread(s) per rank; parameters identical on %d rank(s) (checksum %016llx)\n",
        world_.size(), omp_get_max_threads(), world_.size(), static_cast<unsigned long long>(checksum_));
    std::printf("model: %lld parameters\n%s", static_cast<long long>(layers::parameter_count(*model_)),
                model_->describe().c_str());
    std::printf("data: %s, %lld training and %lld test samples; batch %lld per rank (%lld global)",
                config_.data.dataset == "linear" ? "linear (synthetic)" : config_.data.dir.c_str(),
                static_cast<long long>(train_set_.size), static_cast<long long>(test_set_.size),
                static_cast<long long>(config_.data.batch_size),
                static_cast<long long>(config_.data.batch_size * world_.size() * passes_per_step_));
    std::printf(
        ", %lld steps per epoch\n",
        static_cast<long long>((sampler_.steps_per_epoch() + passes_per_step_ - 1) / passes_per_step_));
    if (world_.size() > 1) {
      std::printf(
          "gradients: %zu bucket(s), fusion threshold %g MiB, overlap %s, compression %s; lr %g scaled to "
          "%g\n",
          reducer_->buckets().size(), config_.distributed.fusion_threshold_mb,
          config_.distributed.overlap ? "on" : "off", config_.distributed.compression.c_str(),
          config_.optimizer.lr, schedule_->scaled_lr());
    }
    const CheckpointConfig& k = config_.checkpoint;
    std::string every;
    if (k.every_steps > 0) every = std::to_string(k.every_steps) + " step(s)";
    if (k.every_epochs > 0)
      every += (every.empty() ? "" : " and ") + std::to_string(k.every_epochs) + " epoch(s)";
    std::printf("checkpoints: %s, %s%s, newest %s kept\n", k.dir.c_str(), every.empty() ? "" : "every ",
                every.empty() ? "at the end only" : (every + " and at the end").c_str(),
                k.keep > 0 ? std::to_string(k.keep).c_str() : "all");
    if (config_.training.epochs <= position_.epochs_completed || step_limit_reached())
      std::printf("dptrain: training already complete at step %lld; nothing to do\n",
                  static_cast<long long>(position_.global_step));
    std::fflush(stdout);
  }

  void report(const EpochMetrics& m) {
    report_epoch_line(m);
    const StepTimes& t = m.step_times;
    std::printf(
        "  per step %.2f ms: data %.2f | compute %.2f | communication not overlapped %.2f | optimizer %.2f | "
        "other %.2f (mean of %d rank(s))\n",
        1e3 * t.total, 1e3 * t.data, 1e3 * t.compute, 1e3 * t.communication, 1e3 * t.optimizer,
        1e3 * (t.total - t.data - t.compute - t.communication - t.optimizer), world_.size());
    std::fflush(stdout);
  }

  void report_epoch_line(const EpochMetrics& m) {
    const std::string resumed =
        m.first_sample > 0 ? " (resumed at sample " + std::to_string(m.first_sample) + ")" : std::string();
    if (config_.model.loss == "mse") {
      std::printf("epoch %lld: train loss %.6g | test loss %.6g | %.0f samples/s (%.0f per rank), %.2f s%s\n",
                  static_cast<long long>(m.epoch), m.train_loss, m.test_loss, m.samples_per_sec,
                  m.samples_per_sec_per_rank, m.epoch_seconds, resumed.c_str());
    } else {
      std::printf(
          "epoch %lld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f samples/s (%.0f per "
          "rank), %.1f s%s\n",
          static_cast<long long>(m.epoch), m.train_loss, 100 * m.train_accuracy, m.test_loss,
          100 * m.test_accuracy, m.samples_per_sec, m.samples_per_sec_per_rank, m.epoch_seconds,
          resumed.c_str());
    }
    std::fflush(stdout);
  }

  std::ofstream open_metrics() {
    if (!world_.is_root()) return {};
    std::filesystem::create_directories(config_.output_dir);
    const std::string path = config_.output_dir + "/metrics.jsonl";
    std::ofstream out(path, resumed_ ? std::ios::app : std::ios::trunc);
    DPTRAIN_CHECK(out, path, ": cannot open for writing (check output_dir)");
    return out;
  }

  void write_metrics(std::ofstream& out, const EpochMetrics& m) {
    Json line = {{"epoch", m.epoch},
                 {"step", m.step},
                 {"train_loss", m.train_loss},
                 {"train_accuracy", m.train_accuracy},
                 {"test_loss", m.test_loss},
                 {"test_accuracy", m.test_accuracy},
                 {"samples_per_sec", m.samples_per_sec},
                 {"samples_per_sec_per_rank", m.samples_per_sec_per_rank},
                 {"epoch_seconds", m.epoch_seconds},
                 {"lr", m.lr},
                 {"world_size", world_.size()}};
    if (m.stopped_early) line["stopped_early"] = "max_steps";
    if (m.first_sample > 0) line["resumed_at_sample"] = m.first_sample;
    const StepTimes& t = m.step_times;
    line["step_ms"] = {{"data", 1e3 * t.data},
                       {"compute", 1e3 * t.compute},
                       {"communication", 1e3 * t.communication},
                       {"optimizer", 1e3 * t.optimizer},
                       {"total", 1e3 * t.total}};
    out << line.dump() << '\n';
    out.flush();
  }

  // Rank 0 gathers every rank's events and writes one Chrome-trace file, a process track per rank.
  void write_timeline() {
    if (config_.distributed.timeline.empty()) return;
    const std::vector<std::string> tracks =
        comm_.gather_to_root(timeline::take_events_json(world_.rank()), "gather of timeline events");
    if (!world_.is_root()) return;
    const std::filesystem::path path(config_.distributed.timeline);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::trunc);
    DPTRAIN_CHECK(out, path.string(), ": cannot open for writing (config key distributed.timeline)");
    out << R"({"displayTimeUnit":"ms","traceEvents":[)";
    for (std::size_t r = 0; r < tracks.size(); ++r) out << (r ? "," : "") << tracks[r];
    out << "]}\n";
    DPTRAIN_CHECK(out.good(), path.string(), ": write failed (disk full?)");
    std::printf("timeline: %s (%.1f MB; open it in https://ui.perfetto.dev or chrome://tracing)\n",
                path.c_str(), static_cast<double>(out.tellp()) / 1e6);
    std::fflush(stdout);
  }

  void save_final_weights() {
    const std::string path = config_.output_dir + "/model.safetensors";
    std::filesystem::create_directories(config_.output_dir);
    safetensors::save(path, model_->named_parameters(), {{"format", "pt"}, {"producer", "dptrain"}});
    std::printf("final weights: %s\n", path.c_str());
  }

  const Config& config_;
  const distributed::World& world_;
  distributed::Communicator comm_;
  data::Dataset train_set_, test_set_;
  data::ShardedSampler sampler_;
  int64_t passes_per_step_;
  std::unique_ptr<layers::Sequential> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<distributed::GradientReducer> reducer_;
  Progress progress_;
  InjectedFault fault_;
  Batch batch_;
  TrainingPosition position_;
  bool resumed_ = false;
  int64_t last_checkpoint_step_ = -1;
  double lr_ = 0;
  uint64_t checksum_ = 0;
};

void use_threads(const Config& config, const distributed::World& world) {
  const int threads = choose_threads(config.threads, world);
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
}

}  // namespace

std::vector<EpochMetrics> train(const Config& config, const distributed::World& world,
                                const RunOptions& options) {
  use_threads(config, world);
  Trainer trainer(config, world);
  trainer.start(options);
  return trainer.run();
}

BenchmarkResult benchmark(const Config& config, const distributed::World& world,
                          const BenchmarkOptions& options) {
  use_threads(config, world);
  Trainer trainer(config, world);
  trainer.start({});
  return trainer.benchmark(options);
}

Evaluation evaluate_checkpoint(const Config& config, const distributed::World& world,
                               const std::string& checkpoint) {
  use_threads(config, world);
  Trainer trainer(config, world);
  return trainer.evaluate_only(checkpoint);
}

}  // namespace dptrain::trainer
