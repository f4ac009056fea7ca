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
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/timeline.h"
#include "data/synthetic.h"
#include "distributed/cross_replica_sum.h"
#include "distributed/mpi_communicator.h"
#include "distributed/state_sync.h"
#include "layers/build.h"
#include "trainer/devices.h"
#include "trainer/run_lock.h"
#include "trainer/trainer.h"

namespace dptrain::trainer {
namespace {

// Written by rank 0 when a signal stopped the run (Trainer::write_stop_note); removed when a run starts.
std::string stop_note_path(const Config& c) {
  return c.output_dir + "/stopped.json";
}

// The directories a run writes: output_dir, and checkpoint.dir when it lies elsewhere.
std::vector<std::string> run_directories(const Config& c) {
  namespace fs = std::filesystem;
  const fs::path output = fs::weakly_canonical(c.output_dir),
                 checkpoints = fs::weakly_canonical(c.checkpoint.dir);
  if (std::mismatch(output.begin(), output.end(), checkpoints.begin(), checkpoints.end()).first ==
      output.end())
    return {c.output_dir};
  return {c.output_dir, c.checkpoint.dir};
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<layers::Sequential> build_model(const ModelConfig& m, uint64_t seed) {
  return m.architecture.empty()
             ? layers::build_sequential(m.layers, m.input_shape, seed)
             : layers::build_architecture(m.architecture, m.input_shape, m.num_classes, seed);
}

// `model` sets the classes of synthetic data: the width of its output.
data::Dataset load_dataset(const Config& c, const layers::Module& model, bool train) {
  if (c.data.dataset == DatasetKind::kSynthetic) {
    const Shape out = model.output_shape(c.model.input_shape);
    DPTRAIN_CHECK(out.size() == 1,
                  "data.dataset \"synthetic\" needs a model with [classes] outputs, this one gives ",
                  shape_str(out));
    return data::make_random_images(train ? c.data.synthetic.samples : c.data.synthetic.test_samples,
                                    c.model.input_shape, static_cast<int>(out[0]), c.seed + (train ? 0 : 1));
  }
  if (c.data.dataset == DatasetKind::kLinear) {
    const LinearDataConfig& l = c.data.linear;
    return data::make_linear_dataset(train ? l.samples : l.test_samples, l.coefficients, l.noise,
                                     c.seed + (train ? 0 : 1));
  }
  return data::load_image_dataset(c.data.dir, train, static_cast<float>(c.data.mean),
                                  static_cast<float>(c.data.std),
                                  train ? c.data.max_train_samples : c.data.max_test_samples);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizerConfig& o, const FlatParameters& parameters) {
  if (o.type == OptimizerKind::kSgd) {
    return std::make_unique<optim::Sgd>(
        parameters, optim::SgdOptions{.momentum = static_cast<float>(o.momentum),
                                      .dampening = static_cast<float>(o.dampening),
                                      .nesterov = o.nesterov,
                                      .weight_decay = static_cast<float>(o.weight_decay)});
  }
  return std::make_unique<optim::Adam>(
      parameters, optim::AdamOptions{.beta1 = static_cast<float>(o.betas[0]),
                                     .beta2 = static_cast<float>(o.betas[1]),
                                     .eps = static_cast<float>(o.eps),
                                     .weight_decay = static_cast<float>(o.weight_decay),
                                     .decoupled_weight_decay = o.type == OptimizerKind::kAdamW});
}

int64_t count_correct(const Tensor& logits, std::span<const int32_t> labels) {
  const std::vector<float> values = logits.to_vector();
  const int64_t classes = logits.dim(1);
  int64_t correct = 0;
  for (std::size_t b = 0; b < labels.size(); ++b) {
    const float* row = values.data() + b * classes;
    correct += (std::max_element(row, row + classes) - row) == labels[b];
  }
  return correct;
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

// CPU threads per rank: the configured number, or this host's cores shared among its ranks.
void use_threads(const Config& config, const distributed::World& world) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = config.threads > 0 ? config.threads : std::max(1, cores / world.local_size());
  omp_set_num_threads(threads);
  // Eigen blocks a GEMM's inner dimension differently when it runs on several threads, which changes
  // the rounding; the project's own OpenMP loops split work by output element and do not. So the
  // deterministic mode keeps GEMMs on one thread and the rest on all.
  Eigen::setNbThreads(config.distributed.deterministic ? 1 : threads);
}

}  // namespace

Trainer::Trainer(const Config& config, const distributed::World& world)
    : config_(config),
      world_(world),
      device_(choose_run_device(config, world)),
      comm_(std::make_unique<distributed::MpiCommunicator>(
          world, distributed::StallPolicy{.warning_s = config.distributed.stall_warning_s,
                                          .abort_s = config.distributed.stall_abort_s})),
      device_comm_(make_device_communicator(config, device_, *comm_)),
      state_comm_(device_comm_ ? device_comm_.get() : comm_.get()),
      model_(build_model(config.model, config.seed)),
      train_set_(load_dataset(config, *model_, true)),
      test_set_(load_dataset(config, *model_, false)),
      deterministic_(config.distributed.deterministic),
      sampler_(train_set_.size,
               config.data.batch_size * (deterministic_ ? config.distributed.backward_passes_per_step : 1),
               world.rank(), world.size(), config.seed, config.data.shuffle, config.data.drop_last,
               deterministic_ ? config.distributed.deterministic_micro_batch : 0),
      batches_per_step_(deterministic_ ? 1 : config.distributed.backward_passes_per_step),
      progress_(world.is_root(), config.training.progress, config.training.log_every_steps),
      fault_(InjectedFault::from_environment()),
      checkpoints_(config.checkpoint, world.rank(), fault_) {
  const std::string dataset = to_string(config.data.dataset);
  DPTRAIN_CHECK(config.model.input_shape == train_set_.sample_shape,
                "config key model.input_shape = ", shape_str(config.model.input_shape),
                " does not match the samples of data.dataset \"", dataset, "\" (",
                shape_str(train_set_.sample_shape), ")");
  const bool regression = !train_set_.targets.empty();
  DPTRAIN_CHECK(config.model.loss == LossKind::kMse || !regression, "data.dataset \"", dataset,
                "\" is a regression dataset; set model.loss to \"mse\"");
  DPTRAIN_CHECK(
      config.model.loss == LossKind::kCrossEntropy || regression,
      "model.loss \"mse\" needs a regression dataset (data.dataset \"linear\"); use \"cross_entropy\" for "
      "classes");
  DPTRAIN_CHECK(sampler_.steps_per_epoch() > 0, "data.batch_size ", config.data.batch_size, " x ",
                world.size(), " ranks is larger than the ", train_set_.size,
                " training samples with data.drop_last");
  DPTRAIN_CHECK(train_set_.size >= world.size(), "only ", train_set_.size, " training samples for ",
                world.size(), " ranks: every rank needs at least one sample per step");

  parameters_ = std::make_unique<FlatParameters>(model_->named_parameters(), device_);
  buffers_ = std::make_unique<FlatParameters>(model_->named_buffers(), device_);
  if (config.distributed.sync_batchnorm && world.size() > 1) {
    batch_stats_sync_ = std::make_unique<distributed::CommunicatorSum>(*state_comm_);
    model_->sync_batch_statistics(batch_stats_sync_.get());
  }
  optimizer_ = make_optimizer(config.optimizer, *parameters_);
  schedule_ = std::make_unique<optim::LrSchedule>(optim::ScheduleOptions{
      .base_lr = config.optimizer.lr,
      .scaling = config.optimizer.lr_scaling,
      .world_size = world.size(),
      .backward_passes_per_step = static_cast<int>(config.distributed.backward_passes_per_step),
      .warmup_epochs = config.optimizer.warmup_epochs,
      .decay = config.optimizer.schedule,
      .step_size_epochs = config.optimizer.step_size_epochs,
      .gamma = config.optimizer.gamma,
      .total_epochs = static_cast<double>(config.training.epochs),
      .min_lr = config.optimizer.min_lr});
  reducer_ = std::make_unique<distributed::GradientReducer>(
      *state_comm_, *parameters_,
      distributed::ReducerOptions{
          .fusion_threshold_mb = config.distributed.fusion_threshold_mb,
          .first_bucket_mb = config.distributed.first_bucket_mb,
          .overlap = config.distributed.overlap,
          // PowerSGD replaces the reducer once it starts; before, plain sums.
          .compression = config.distributed.compression == distributed::Compression::kPowerSgd
                             ? distributed::Compression::kNone
                             : config.distributed.compression,
          .check_finite = config.distributed.check_finite});
  if (deterministic_) {
    DPTRAIN_CHECK(device_.is_host(),
                  "config key distributed.deterministic runs on the CPU; this run's device is ",
                  device_.str());
    DPTRAIN_CHECK(buffers_->size() == 0,
                  "config key distributed.deterministic does not take BatchNorm layers: their running "
                  "statistics would follow whichever rank holds which micro-batch");
    exact_sum_ = std::make_unique<distributed::ExactGradientSum>(*state_comm_, *parameters_);
  }
  if (config.distributed.compression == distributed::Compression::kPowerSgd) {
    const DistributedConfig::PowerSgd& p = config.distributed.powersgd;
    powersgd_ = std::make_unique<distributed::PowerSgdReducer>(
        *state_comm_, *parameters_,
        distributed::PowerSgdOptions{.rank = p.rank,
                                     .start_step = p.start_step,
                                     .min_compression_rate = p.min_compression_rate,
                                     .seed = config.seed,
                                     .check_finite = config.distributed.check_finite});
  }
}

Trainer::~Trainer() = default;

void Trainer::start(const RunOptions& options) {
  if (world_.is_root()) {
    if (!options.resume.empty()) resume(options.resume);
    if (!config_.model.init_from.empty() && !resumed_) init_from(config_.model.init_from);
  }
  position_.optimizer_steps = optimizer_->steps_taken();
  int64_t scalars[] = {position_.optimizer_steps, position_.epochs_completed, position_.epoch_samples_done,
                       position_.global_step,     position_.samples_seen,     resumed_};
  std::vector<Tensor> state = {parameters_->values(), buffers_->values()};
  for (const Tensor& slot : optimizer_->state_buffers()) state.push_back(slot);
  if (powersgd_) state.push_back(powersgd_->q());
  distributed::broadcast_state(*comm_, *state_comm_, state, std::span<int64_t>(scalars));
  if (powersgd_) hand_out_powersgd_errors();
  position_ = {.epochs_completed = scalars[1],
               .epoch_samples_done = scalars[2],
               .global_step = scalars[3],
               .samples_seen = scalars[4],
               .optimizer_steps = scalars[0]};
  resumed_ = scalars[5] != 0;
  optimizer_->set_steps_taken(position_.optimizer_steps);
  checkpoints_.resumed_at(resumed_ ? position_.global_step : -1);
  checksum_ = distributed::verify_identical(*comm_, parameters_->parameters());
  if (!config_.distributed.timeline.empty()) {
    comm_->barrier("barrier before the timeline starts");  // lines the ranks' tracks up
    timeline::enable();
  }
}

TrainingResult Trainer::run() {
  if (world_.is_root()) {
    std::filesystem::remove(stop_note_path(config_));  // a previous run's: this one decides anew
    if (!resumed_) {
      const std::string cleared = checkpoints_.clear_earlier();
      if (!cleared.empty()) std::printf("%s\n", cleared.c_str());
    }
    print_summary(config_, summary());
  }
  MetricsLog metrics(config_, world_.is_root(), /*append=*/resumed_);
  TrainingResult result;
  for (int64_t epoch = position_.epochs_completed + 1;
       epoch <= config_.training.epochs && !step_limit_reached() && !stop_.any(); ++epoch) {
    EpochMetrics m = train_epoch(epoch);
    // A stop request wants the checkpoint now: the grace before SIGKILL may be a second or two.
    if (stop_.any()) break;
    const Evaluation e = evaluate();
    m.test_loss = e.loss;
    m.test_accuracy = e.accuracy;
    result.epochs.push_back(m);
    if (world_.is_root()) print_epoch(config_, world_.size(), m);
    metrics.write(m, world_.size());
    if (checkpoints_.due_at_epoch_end(epoch, position_.global_step, m.stopped_early)) save_checkpoint();
  }
  if (checkpoints_.due_at_end(position_.global_step)) save_checkpoint();
  if (stop_.any()) {
    result.stopped_by = stop_.describe();
    write_stop_note(result.stopped_by);
    return result;
  }
  if (world_.is_root()) {
    const std::string path = config_.output_dir + "/model.safetensors";
    std::filesystem::create_directories(config_.output_dir);
    std::vector<NamedTensor> weights;
    for (const NamedTensor& p : model_state())
      weights.push_back({p.name, p.tensor.to(Device::cpu()), p.stored});
    safetensors::save(path, weights, {{"format", "pt"}, {"producer", "dptrain"}});
    std::printf("final weights: %s\n", path.c_str());
  }
  if (!config_.distributed.timeline.empty()) write_timeline(*comm_, config_.distributed.timeline);
  return result;
}

EpochMetrics Trainer::train_epoch(int64_t epoch) {
  const int64_t first_sample = epoch == position_.epochs_completed + 1 ? position_.epoch_samples_done : 0;
  sampler_.set_epoch(epoch - 1, first_sample);
  model_->set_training(true);
  const int64_t steps = (sampler_.steps_per_epoch() + batches_per_step_ - 1) / batches_per_step_;
  progress_.begin_epoch(epoch, config_.training.epochs, steps);
  StepTotals totals;
  const auto start = Clock::now();
  int64_t step = 0;
  for (; step < steps && !step_limit_reached() && !stop_.any(); ++step) {
    fault_.before_step(world_.rank(), position_.global_step);
    run_step(epoch, step, totals);
    progress_.update(
        step, totals.loss_sum.value() / totals.samples,
        config_.model.loss == LossKind::kMse ? -1.0 : static_cast<double>(totals.correct) / totals.samples,
        totals.samples * world_.size() / seconds_since(start));
    stop_ = agree_on_stop();
    const bool epoch_ends = step + 1 == steps || step_limit_reached() || stop_.any();
    if (!epoch_ends && checkpoints_.due_after_step(position_.global_step)) save_checkpoint();
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
  distributed::ExactScalarSum loss = totals.loss_sum;
  loss.allreduce(*comm_, "allreduce of the epoch's loss");
  int64_t counts[2] = {totals.correct, totals.samples};
  comm_->allreduce(std::span<int64_t>(counts), distributed::ReduceOp::kSum, "allreduce of epoch metrics");
  const double samples = static_cast<double>(counts[1]);
  m.train_loss = loss.value() / std::max(samples, 1.0);
  m.train_accuracy = static_cast<double>(counts[0]) / std::max(samples, 1.0);
  m.samples_per_sec = samples / m.epoch_seconds;
  m.samples_per_sec_per_rank = m.samples_per_sec / world_.size();
  m.stopped_early = step < steps;
  m.gradient_bytes_per_step =
      static_cast<double>(totals.payload_bytes) / static_cast<double>(std::max<int64_t>(totals.steps, 1));
  return m;
}

// Step `step` of the current epoch: backward_passes_per_step batches, one averaged update.
void Trainer::train_step(int64_t epoch, int64_t step, StepTotals& totals) {
  const int64_t batches = sampler_.steps_per_epoch();
  const int64_t first_batch = step * batches_per_step_;
  const int64_t passes = std::min(batches_per_step_, batches - first_batch);
  // The schedule runs on samples, not steps, so a resume on another world size keeps its place.
  lr_ = schedule_->at(static_cast<double>(epoch - 1) +
                      static_cast<double>(sampler_.samples_before(first_batch)) / sampler_.dataset_size());

  const bool compressed = powersgd_ && powersgd_->compresses(position_.global_step);
  optimizer_->zero_grad();
  if (buffers_follow_rank0()) {
    Phase phase(totals.communication, "broadcast of buffers");
    broadcast_buffers_from_rank0();
  }
  for (int64_t pass = 0; pass < passes; ++pass) {
    {
      Phase phase(totals.data, "data");
      load_batch(train_set_, sampler_.batch_indices(first_batch + pass));
    }
    model_->reseed(dropout_stream(pass));
    Tensor output, loss;
    {
      Phase phase(totals.forward, "forward");
      output = model_->forward(batch_.inputs);
      loss = config_.model.loss == LossKind::kMse ? ops::mse(output, batch_.targets)
                                                  : ops::cross_entropy(output, batch_.labels);
    }
    // Buckets launch during the last backward; PowerSGD compresses after it.
    if (pass == passes - 1 && !compressed) reducer_->prepare(position_.global_step);
    {
      Phase phase(totals.backward, "backward");
      loss.backward(reducer_->loss_scale(passes));  // the reducer's sums are then averages
    }
    count_batch(output, loss, totals);
  }
  if (compressed) {
    Phase phase(totals.communication, "PowerSGD");
    powersgd_->reduce(position_.global_step);  // the low-rank approximation of the average
  } else {
    Phase phase(totals.communication, "finish gradient averaging");
    reducer_->finish();  // gradients are now the average over all ranks and passes
  }
  totals.payload_bytes += gradient_payload_bytes(position_.global_step);
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

// Step `step` in distributed.deterministic mode: the step's global batch is cut into micro-batches in
// the sampler's order; this rank runs its contiguous share of them one by one, each with the same
// shapes and kernels whichever rank runs it, and the gradients are summed in fixed point
// (distributed/exact_sum.h), so the update has the same bits for any number of ranks.
void Trainer::train_step_deterministic(int64_t epoch, int64_t step, StepTotals& totals) {
  const int64_t step_samples = sampler_.samples_before(step + 1) - sampler_.samples_before(step);
  lr_ = schedule_->at(static_cast<double>(epoch - 1) +
                      static_cast<double>(sampler_.samples_before(step)) / sampler_.dataset_size());
  const std::span<const int64_t> mine = sampler_.batch_indices(step);
  const int64_t micro = config_.distributed.deterministic_micro_batch;
  const int64_t local = (static_cast<int64_t>(mine.size()) + micro - 1) / micro;
  exact_sum_->begin(position_.global_step, sampler_.micro_batches(step), local);
  for (int64_t i = 0; i < local; ++i) {
    optimizer_->zero_grad();
    const std::span<const int64_t> indices = mine.subspan(
        static_cast<std::size_t>(i * micro),
        static_cast<std::size_t>(std::min<int64_t>(micro, static_cast<int64_t>(mine.size()) - i * micro)));
    {
      Phase phase(totals.data, "data");
      load_batch(train_set_, indices);
    }
    model_->reseed(dropout_stream_of_micro_batch(sampler_.first_micro_batch(step) + i));
    Tensor output, loss;
    {
      Phase phase(totals.forward, "forward");
      output = model_->forward(batch_.inputs);
      loss = config_.model.loss == LossKind::kMse ? ops::mse(output, batch_.targets)
                                                  : ops::cross_entropy(output, batch_.labels);
    }
    {
      Phase phase(totals.backward, "backward");
      // The micro-batch's share of the step's mean loss: the fixed-point sum is then the average.
      loss.backward(
          static_cast<float>(static_cast<double>(indices.size()) / static_cast<double>(step_samples)));
      exact_sum_->add_micro_batch();
    }
    count_batch(output, loss, totals);
  }
  if (local == 0) optimizer_->zero_grad();
  {
    Phase phase(totals.communication, "exact gradient sum");
    exact_sum_->finish();
  }
  totals.payload_bytes += gradient_payload_bytes(position_.global_step);
  {
    Phase phase(totals.optimizer, "optimizer");
    optimizer_->step(static_cast<float>(lr_));
  }
  position_.samples_seen += step_samples;
  position_.epoch_samples_done = sampler_.samples_before(step + 1);
  position_.optimizer_steps = optimizer_->steps_taken();
  ++position_.global_step;
  ++totals.steps;
}

void Trainer::count_batch(const Tensor& output, const Tensor& loss, StepTotals& totals) const {
  const int64_t n = output.dim(0);
  totals.loss_sum.add(static_cast<double>(loss.item()) * static_cast<double>(n));
  if (config_.model.loss == LossKind::kCrossEntropy) totals.correct += count_correct(output, batch_.labels);
  totals.samples += n;
}

// Without SyncBatchNorm each rank's running statistics follow its own batches; as DDP does, every
// step and every evaluation starts from rank 0's, so all ranks evaluate and checkpoint one model.
bool Trainer::buffers_follow_rank0() const {
  return config_.distributed.broadcast_buffers && !batch_stats_sync_ && world_.size() > 1 &&
         buffers_->size() > 0;
}

void Trainer::broadcast_buffers_from_rank0() {
  state_comm_->broadcast(
      std::span<float>(buffers_->values().data_ptr(), static_cast<std::size_t>(buffers_->size())), 0,
      "broadcast of BatchNorm buffers from rank 0");
}

// The test set is cut into chunks of eval_batch_size in order, and each rank evaluates a contiguous
// run of chunks. Each chunk is then computed alike on any number of ranks, and the sums are exact, so
// the figures do not depend on the world size.
Evaluation Trainer::evaluate() {
  timeline::Span span("evaluate", "evaluate");
  // The last step's forward moved each rank's running statistics on its own batch: evaluate the
  // model rank 0 checkpoints (DDP broadcasts before every forward, evaluation's included).
  if (buffers_follow_rank0()) broadcast_buffers_from_rank0();
  NoGradGuard no_grad;
  model_->set_training(false);
  const int64_t n = test_set_.size, r = world_.rank(), size = world_.size(),
                chunk = config_.data.eval_batch_size, chunks = (n + chunk - 1) / chunk;
  const int64_t begin = std::min(n, chunks * r / size * chunk),
                end = std::min(n, chunks * (r + 1) / size * chunk);
  const bool mse = config_.model.loss == LossKind::kMse;
  distributed::ExactScalarSum loss_sum;
  int64_t correct = 0;
  std::vector<int64_t> indices;
  for (int64_t first = begin; first < end; first += chunk) {
    const int64_t last = std::min(end, first + chunk);
    indices.resize(last - first);
    for (int64_t i = first; i < last; ++i) indices[i - first] = i;
    load_batch(test_set_, indices);
    const Tensor output = model_->forward(batch_.inputs);
    const Tensor loss = mse ? ops::mse(output, batch_.targets) : ops::cross_entropy(output, batch_.labels);
    loss_sum.add(static_cast<double>(loss.item()) * static_cast<double>(last - first));
    if (!mse) correct += count_correct(output, batch_.labels);
  }
  loss_sum.allreduce(*comm_, "allreduce of the evaluation loss");
  comm_->allreduce(std::span<int64_t>(&correct, 1), distributed::ReduceOp::kSum,
                   "allreduce of correct predictions");
  return {.loss = loss_sum.value() / static_cast<double>(n),
          .accuracy = mse ? 0.0 : static_cast<double>(correct) / static_cast<double>(n),
          .correct = correct,
          .samples = n};
}

Evaluation Trainer::evaluate_checkpoint(const std::string& path) {
  if (world_.is_root()) restore(read_checkpoint(path), model_state(), nullptr);
  int64_t none = 0;
  distributed::broadcast_state(*comm_, *state_comm_, {parameters_->values(), buffers_->values()},
                               std::span<int64_t>(&none, 1));
  const Evaluation e = evaluate();
  if (world_.is_root()) print_evaluation(config_, world_.size(), path, e);
  return e;
}

// The batch's samples gathered on the host, then on the run's device. Host buffers come from the
// storage cache, so steady-state steps do not allocate.
void Trainer::load_batch(const data::Dataset& ds, std::span<const int64_t> indices) {
  const int64_t n = static_cast<int64_t>(indices.size());
  Shape shape{n};
  shape.insert(shape.end(), ds.sample_shape.begin(), ds.sample_shape.end());
  Tensor inputs = Tensor::empty(shape);
  batch_.labels.resize(indices.size());
  const bool regression = !ds.targets.empty();
  Tensor targets =
      regression ? Tensor::empty({n, static_cast<int64_t>(ds.targets.size()) / ds.size}) : Tensor();
  data::gather_batch(ds, indices, inputs.data(), batch_.labels.data(), regression ? targets.data() : nullptr);
  batch_.inputs = inputs.to(device_);
  batch_.targets = regression ? targets.to(device_) : Tensor();
}

// ---- checkpoints ----

// Rank 0: loads `which` ("auto" or a path) into the parameters, optimizer state and position_.
void Trainer::resume(const std::string& which) {
  const std::optional<Checkpoint> found = checkpoints_.find(which, [&](const Checkpoint& c) {
    DPTRAIN_CHECK(c.position.epoch_samples_done < train_set_.size, c.path, ": its position (sample ",
                  c.position.epoch_samples_done, " of epoch ", c.position.epochs_completed + 1,
                  ") lies beyond the ", train_set_.size, " training samples configured now");
    check_deterministic_resume(c);
    std::vector<NamedTensor> state = optimizer_->state();
    if (powersgd_) state = powersgd_resume_state(c);
    // PowerSGD's state is optional either way: it can be switched on or off at a resume.
    restore(c, model_state(), &state, {"powersgd.q", "powersgd.error"});
  });
  if (!found) {
    std::printf("dptrain: --resume auto: no checkpoint in %s; starting fresh\n",
                config_.checkpoint.dir.c_str());
    return;
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
              static_cast<long long>(c.position.epoch_samples_done), static_cast<long long>(train_set_.size),
              written.c_str(),
              written == now ? "" : (", now " + now + ": same samples, lr rescaled").c_str());
}

// model.init_from: weights only, from a checkpoint (validated) or a plain safetensors file.
void Trainer::init_from(const std::string& path) {
  safetensors::File file = safetensors::load(path);
  if (file.metadata.contains("dptrain_checkpoint_version")) {
    restore(validate_checkpoint(std::move(file), path), model_state(), nullptr);
  } else {
    layers::load_parameters(*model_, file, path);
  }
}

void Trainer::save_checkpoint() {
  Tensor powersgd_errors;  // every rank's, gathered on all (a collective: every rank saves)
  if (powersgd_) {
    powersgd_errors = Tensor::zeros({world_.size(), parameters_->size()});
    const Tensor& mine = powersgd_->error();
    comm_->allgather(
        std::span<const float>(mine.data_ptr(), static_cast<std::size_t>(mine.numel())),
        std::span<float>(powersgd_errors.data_ptr(), static_cast<std::size_t>(powersgd_errors.numel())),
        "allgather of PowerSGD's error buffers for a checkpoint");
  }
  const Json sampler = {{"seed", config_.seed},
                        {"shuffle", config_.data.shuffle},
                        {"drop_last", config_.data.drop_last},
                        {"dataset_size", train_set_.size},
                        {"epoch", position_.epochs_completed},
                        {"first_sample", position_.epoch_samples_done}};
  const Json rng = {
      {"seed", config_.seed},
      {"dropout", deterministic_ ? "reseeded each micro-batch from (seed, global_step, micro-batch)"
                                 : "reseeded each pass from (seed, rank, global_step, pass)"},
      {"initialisation", "from (seed, parameter name)"}};
  const std::string note =
      checkpoints_.save({.parameters = model_state(),
                         .optimizer_state = training_state(powersgd_errors),
                         .position = position_,
                         .metadata = {{"producer", "dptrain"},
                                      {"world_size", std::to_string(world_.size())},
                                      {"batch_size", std::to_string(config_.data.batch_size)},
                                      {"backward_passes_per_step",
                                       std::to_string(config_.distributed.backward_passes_per_step)},
                                      {"deterministic", deterministic_metadata().dump()},
                                      {"optimizer", to_string(config_.optimizer.type)},
                                      {"lr", std::to_string(lr_)},
                                      {"sampler", sampler.dump()},
                                      {"rng", rng.dump()},
                                      {"config", to_json(config_).dump()}}});
  if (!note.empty()) progress_.note(note);
}

// ---- helpers ----

// Once per step: one allreduce of three counters. Every rank leaves the loop after the same step, so
// rank 0's checkpoint is of the step every rank stopped at.
StopRequests Trainer::agree_on_stop() const {
  StopRequests requests = StopRequests::of_this_process();
  if (world_.size() == 1) return requests;
  int64_t counts[3] = {requests.sigterm, requests.sigint, requests.sigusr1};
  comm_->allreduce(std::span<int64_t>(counts), distributed::ReduceOp::kSum, "allreduce of stop requests");
  return {.sigterm = counts[0], .sigint = counts[1], .sigusr1 = counts[2]};
}

// Rank 0 records the stop beside the checkpoints (stop_note_path): under mpirun, a SIGTERM to
// mpirun itself makes mpirun exit 1 whatever the ranks return, and a wrapper can still tell.
void Trainer::write_stop_note(const std::string& why) const {
  if (!world_.is_root()) return;
  const std::string checkpoint = config_.checkpoint.dir + "/" + checkpoint_file_name(position_.global_step);
  const Json note = {{"stopped_by", why},
                     {"global_step", position_.global_step},
                     {"checkpoint", checkpoint},
                     {"exit_status", kExitStoppedWithCheckpoint},
                     {"resume", "run the same command with --resume auto"}};
  std::ofstream(stop_note_path(config_)) << note.dump() << "\n";
  std::fflush(stdout);
  std::fprintf(stderr,
               "dptrain: stopped by %s after step %lld, checkpoint %s written; exiting with status %d "
               "(resume with --resume auto)\n",
               why.c_str(), static_cast<long long>(position_.global_step), checkpoint.c_str(),
               kExitStoppedWithCheckpoint);
}

std::vector<NamedTensor> Trainer::model_state() const {
  return layers::state_tensors(*model_);
}

bool Trainer::step_limit_reached() const {
  return config_.training.max_steps > 0 && position_.global_step >= config_.training.max_steps;
}

// Per-step means over all ranks' steps; `wall_seconds` is this rank's time for its totals.steps.
StepTimes Trainer::mean_step_times(const StepTotals& t, double wall_seconds) {
  double sums[6] = {t.data,      t.forward + t.backward, t.communication,
                    t.optimizer, wall_seconds,           static_cast<double>(t.steps)};
  comm_->allreduce(std::span<double>(sums), distributed::ReduceOp::kSum, "allreduce of step times");
  const double per_step = 1.0 / std::max(sums[5], 1.0);
  return {.data = sums[0] * per_step,
          .compute = sums[1] * per_step,
          .communication = sums[2] * per_step,
          .optimizer = sums[3] * per_step,
          .total = sums[4] * per_step};
}

std::vector<NamedTensor> Trainer::training_state(const Tensor& powersgd_errors) const {
  std::vector<NamedTensor> state = optimizer_->state();
  if (powersgd_) {
    state.push_back({"powersgd.q", powersgd_->q()});
    state.push_back({"powersgd.error", powersgd_errors});
  }
  return state;
}

// Rank 0, resuming with PowerSGD: what to restore of its state from `c`, with a note when the
// checkpoint's state does not fit (written without PowerSGD, or for another rank).
std::vector<NamedTensor> Trainer::powersgd_resume_state(const Checkpoint& c) {
  std::vector<NamedTensor> state = optimizer_->state();
  const std::string prefix = kOptimizerPrefix;
  const Tensor* errors = c.file.find(prefix + "powersgd.error");
  const Tensor* q = c.file.find(prefix + "powersgd.q");
  resumed_powersgd_ranks_ = 0;
  resumed_powersgd_errors_ = Tensor();
  // Errors have the flat gradient layout, whatever the rank; written by however many ranks ran
  // then (start() hands them out).
  if (errors != nullptr && errors->ndim() == 2 && errors->dim(1) == parameters_->size()) {
    resumed_powersgd_ranks_ = errors->dim(0);
    resumed_powersgd_errors_ = Tensor::zeros({resumed_powersgd_ranks_, parameters_->size()});
    state.push_back({"powersgd.error", resumed_powersgd_errors_});
  }
  if (q != nullptr && q->shape() == powersgd_->q().shape()) state.push_back({"powersgd.q", powersgd_->q()});
  if (q == nullptr && errors == nullptr) {
    std::printf("dptrain: %s holds no PowerSGD state (written without it): Q from the seed, errors zero\n",
                c.path.c_str());
  } else if (q == nullptr || q->shape() != powersgd_->q().shape()) {
    std::printf(
        "dptrain: %s: PowerSGD's Q was for another powersgd.rank or min_compression_rate; drawn "
        "afresh from the seed, error buffers kept\n",
        c.path.c_str());
  }
  return state;
}

void Trainer::hand_out_powersgd_errors() {
  int64_t saved_ranks = resumed_powersgd_ranks_;  // 0 unless rank 0 resumed
  comm_->broadcast(std::span<int64_t>(&saved_ranks, 1), 0,
                   "broadcast of the ranks that wrote PowerSGD's errors");
  if (saved_ranks == 0) return;  // a fresh start: no error yet
  const int64_t size = parameters_->size();
  if (!world_.is_root()) resumed_powersgd_errors_ = Tensor::zeros({saved_ranks, size});
  comm_->broadcast(
      std::span<float>(resumed_powersgd_errors_.data_ptr(), static_cast<std::size_t>(saved_ranks * size)), 0,
      "broadcast of PowerSGD's error buffers");
  const float* saved = resumed_powersgd_errors_.data_ptr();
  float* error = powersgd_->error().data_ptr();
  if (saved_ranks == world_.size()) {
    std::copy_n(saved + world_.rank() * size, size, error);
  } else if (world_.is_root()) {
    std::fill_n(error, size, 0.0f);
    for (int64_t r = 0; r < saved_ranks; ++r)
      for (int64_t i = 0; i < size; ++i) error[i] += saved[r * size + i];
    std::printf("dptrain: PowerSGD's error buffers of %lld rank(s) summed into rank 0's (%d rank(s) now)\n",
                static_cast<long long>(saved_ranks), world_.size());
  }
  resumed_powersgd_errors_ = Tensor();
  resumed_powersgd_ranks_ = 0;
}

int64_t Trainer::gradient_payload_bytes(int64_t global_step) const {
  if (world_.size() == 1) return 0;
  const int64_t size = parameters_->size();
  if (deterministic_) return static_cast<int64_t>(sizeof(int64_t)) * size;
  if (powersgd_ && powersgd_->compresses(global_step))
    return static_cast<int64_t>(sizeof(float)) * powersgd_->payload_elements();
  const bool half = config_.distributed.compression == distributed::Compression::kFp16 ||
                    config_.distributed.compression == distributed::Compression::kBf16;
  return static_cast<int64_t>(half ? sizeof(uint16_t) : sizeof(float)) * size;
}

std::string Trainer::powersgd_description() const {
  if (!powersgd_) return "";
  const DistributedConfig::PowerSgd& p = config_.distributed.powersgd;
  const int64_t compressed = static_cast<int64_t>(powersgd_->matrices().size()),
                tensors = static_cast<int64_t>(parameters_->parameters().size());
  char text[256];
  std::snprintf(
      text, sizeof text,
      "rank %lld from step %lld (plain allreduce before), %lld of %lld tensors compressed: %lld "
      "elements per step instead of %lld, %.1fx fewer",
      static_cast<long long>(p.rank), static_cast<long long>(p.start_step),
      static_cast<long long>(compressed), static_cast<long long>(tensors),
      static_cast<long long>(powersgd_->payload_elements()), static_cast<long long>(parameters_->size()),
      static_cast<double>(parameters_->size()) / static_cast<double>(powersgd_->payload_elements()));
  return text;
}

int64_t Trainer::global_batch() const {
  return config_.data.batch_size * world_.size() * config_.distributed.backward_passes_per_step;
}

Json Trainer::deterministic_metadata() const {
  if (!deterministic_) return false;
  return {{"micro_batch", config_.distributed.deterministic_micro_batch}, {"global_batch", global_batch()}};
}

// Bit-for-bit continuation needs the same micro-batches: the same global batch and micro-batch size.
void Trainer::check_deterministic_resume(const Checkpoint& c) const {
  if (!deterministic_) return;
  const auto entry = c.file.metadata.find("deterministic");
  const Json then = entry == c.file.metadata.end() ? Json(false) : Json::parse(entry->second, nullptr, false);
  const auto number = [&](const char* key) -> int64_t {
    return then.is_object() && then.contains(key) && then[key].is_number_integer() ? then[key].get<int64_t>()
                                                                                   : -1;
  };
  if (!then.is_object()) {
    std::printf(
        "dptrain: %s was not written in distributed.deterministic mode; training continues "
        "deterministically from it\n",
        c.path.c_str());
    return;
  }
  const int64_t batch = number("global_batch"), micro = number("micro_batch");
  const int64_t micro_now = config_.distributed.deterministic_micro_batch;
  if (batch == global_batch() && micro == micro_now) return;
  const int64_t per_rank = world_.size() * config_.distributed.backward_passes_per_step;
  const std::string fix =
      batch % per_rank == 0
          ? "set data.batch_size = " + std::to_string(batch / per_rank)
          : "use ranks x data.batch_size x backward_passes_per_step = " + std::to_string(batch);
  DPTRAIN_FAIL(c.path, ": written in distributed.deterministic mode with a global batch of ", batch,
               " in micro-batches of ", micro, "; this run has ", global_batch(), " (", world_.size(),
               " rank(s) x data.batch_size ", config_.data.batch_size, " x ",
               config_.distributed.backward_passes_per_step, " backward pass(es)) in micro-batches of ",
               micro_now, ". To continue bit for bit, ", fix,
               " and distributed.deterministic_micro_batch = ", micro,
               "; or set distributed.deterministic to false");
}

// Dropout masks follow from (seed, rank, step, pass): a resumed run draws the same ones.
uint64_t Trainer::dropout_stream(int64_t pass) const {
  return derive_seed(config_.seed, "dropout/rank" + std::to_string(world_.rank()) + "/step" +
                                       std::to_string(position_.global_step) + "/pass" +
                                       std::to_string(pass));
}

// In deterministic mode the masks follow the micro-batch (its place in the step's global order),
// not the rank that runs it.
uint64_t Trainer::dropout_stream_of_micro_batch(int64_t micro_batch) const {
  return derive_seed(config_.seed, "dropout/step" + std::to_string(position_.global_step) + "/micro" +
                                       std::to_string(micro_batch));
}

RunSummary Trainer::summary() const {
  return {.ranks = world_.size(),
          .threads = omp_get_max_threads(),
          .device = device_.str(),
          .parameters_checksum = checksum_,
          .parameters = layers::parameter_count(*model_),
          .model_description = model_->describe(),
          .train_samples = train_set_.size,
          .test_samples = test_set_.size,
          .global_batch = global_batch(),
          .steps_per_epoch = (sampler_.steps_per_epoch() + batches_per_step_ - 1) / batches_per_step_,
          .buckets = reducer_->buckets().size(),
          .powersgd = powersgd_description(),
          .scaled_lr = schedule_->scaled_lr(),
          .already_complete = config_.training.epochs <= position_.epochs_completed || step_limit_reached(),
          .global_step = position_.global_step};
}

// ---- the interface of train.h ----

TrainingResult train(const Config& config, const distributed::World& world, const RunOptions& options) {
  use_threads(config, world);
  // Before anything reads or clears checkpoints: a second job on these directories stops here.
  std::vector<std::unique_ptr<DirectoryLock>> locks;
  if (world.is_root()) {
    const auto report = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    for (const std::string& dir : run_directories(config))
      locks.push_back(std::make_unique<DirectoryLock>(dir, report));
  }
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
  return trainer.evaluate_checkpoint(checkpoint);
}

}  // namespace dptrain::trainer
