// The training run: set-up (model, data, optimizer, schedule, gradient sync), the epoch loop with
// evaluation and metrics (the step itself is step.cpp), and the entry points of run.h. Before the
// first step every rank takes rank 0's parameters, optimizer state and position (fresh, or read from
// a checkpoint by rank 0 alone); rank 0 writes checkpoints as training goes.
#include "trainer/run.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/timeline.h"
#include "data/registry.h"
#include "distributed/cross_replica_sum.h"
#include "distributed/mpi_communicator.h"
#include "distributed/state_sync.h"
#include "layers/build.h"
#include "optim/registry.h"
#include "trainer/devices.h"
#include "trainer/directory_lock.h"
#include "trainer/phase.h"
#include "trainer/threads.h"
#include "trainer/trainer.h"

namespace dptrain::trainer {
namespace {

// The directories a run writes, each to be locked, with the keys that name them: output_dir, and
// checkpoint.dir unless it is the same. A checkpoint.dir inside output_dir is locked too: another run
// may name it as its own checkpoint.dir, and its fresh start would then remove this run's checkpoints.
std::vector<std::pair<std::string, std::string>> run_directories(const Config& c) {
  namespace fs = std::filesystem;
  // "run" and "run/": one directory (a second lock on it would find this very run holding it).
  const auto key = [](const std::string& dir) {
    const fs::path p = fs::weakly_canonical(dir);
    return p.has_filename() ? p : p.parent_path();
  };
  if (key(c.output_dir) == key(c.checkpoint.dir)) return {{c.output_dir, "output_dir"}};
  return {{c.output_dir, "output_dir"}, {c.checkpoint.dir, "checkpoint.dir"}};
}

std::unique_ptr<layers::Sequential> build_model(const ModelConfig& m, uint64_t seed) {
  return m.architecture.empty()
             ? layers::build_sequential(m.layers, m.input_shape, seed)
             : layers::build_architecture(m.architecture, m.input_shape, m.num_classes, seed);
}

// `model` sets the classes of generated data: the width of its output.
std::unique_ptr<data::Dataset> open_dataset(const Config& c, const layers::Module& model, bool train) {
  const DataConfig& d = c.data;
  const Shape out = model.output_shape(c.model.input_shape);
  const int64_t max_samples = train ? d.max_train_samples : d.max_test_samples;
  std::unique_ptr<data::Dataset> dataset =
      data::dataset_format(d.dataset).open({.train = train,
                                            .dir = d.dir,
                                            .max_samples = max_samples,
                                            .resize = d.resize,
                                            .seed = c.seed,
                                            .sample_shape = c.model.input_shape,
                                            .model_classes = out.size() == 1 ? out[0] : 0,
                                            .linear = d.linear,
                                            .synthetic = d.synthetic});
  dataset->keep_first(max_samples);
  return dataset;
}

std::vector<float> per_channel(const Json& value) {
  std::vector<float> out;
  for (const Json& x : value.is_array() ? value : Json::array({value})) out.push_back(x.get<float>());
  return out;
}

// A GPU's batches are read into memory it copies from in place (Backend::allocate_host).
data::SlotMemory slot_memory_of(Backend& backend) {
  return {.allocate = [&backend](std::size_t bytes) { return backend.allocate_host(bytes); },
          .release = [&backend](void* pointer) { backend.release_host(pointer); },
          .wait_for_readers = [&backend] { backend.wait_for_uploads(); }};
}

data::LoaderOptions loader_options(const Config& c, const data::Dataset& dataset,
                                   const distributed::World& world, Device device, bool train) {
  const DataConfig& d = c.data;
  return {.workers = static_cast<int>(
              d.workers >= 0 ? d.workers
                             : data::default_workers(dataset.read_cost(),
                                                     threads_for_this_process(0, world.local_size()),
                                                     !device.is_host())),
          .prefetch = static_cast<int>(d.prefetch),
          .mean = per_channel(d.mean),
          .std = per_channel(d.std),
          .augmentation = train ? data::Augmentation{.crop_padding = d.augment.random_crop_padding,
                                                     .horizontal_flip = d.augment.horizontal_flip}
                                : data::Augmentation{},
          .seed = c.seed,
          .skip_bad_samples = d.on_bad_sample == OnBadSample::kSkip,
          .slot_memory = device.is_host() ? data::SlotMemory{} : slot_memory_of(backend_for(device))};
}

std::string describe_loader(const Config& c, const data::BatchLoader& loader) {
  std::string line = std::to_string(loader.workers()) + " worker(s) per rank";
  line += loader.workers() > 0 ? ", " + std::to_string(c.data.prefetch) + " batch(es) read ahead"
                               : ", reading inline";
  const AugmentConfig& a = c.data.augment;
  std::string augment;
  if (a.random_crop_padding > 0)
    augment = "random crop (padding " + std::to_string(a.random_crop_padding) + ")";
  if (a.horizontal_flip) augment += (augment.empty() ? "" : " + ") + std::string("horizontal flip");
  line += "; augmentation: " + (augment.empty() ? std::string("none") : augment);
  if (c.data.on_bad_sample == OnBadSample::kSkip) line += "; bad samples skipped";
  return line;
}

// `shard`: the ranges this rank updates, with distributed.shard_optimizer; null: all.
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizerConfig& o, const FlatParameters& parameters,
                                                 const distributed::ShardLayout* shard) {
  return optim::make_optimizer(o.type, parameters,
                               {.momentum = o.momentum,
                                .dampening = o.dampening,
                                .nesterov = o.nesterov,
                                .weight_decay = o.weight_decay,
                                .beta1 = o.betas[0],
                                .beta2 = o.betas[1],
                                .eps = o.eps,
                                .owned = shard != nullptr ? shard->owned() : std::vector<FlatRange>{}});
}

// The data set against the model and the world: what the config alone could not check.
void check_data_fits(const Config& c, const layers::Module& model, const data::Dataset& train,
                     const data::Dataset& test, const data::ShardedSampler& sampler,
                     const distributed::World& world) {
  const std::string& dataset = c.data.dataset;
  DPTRAIN_CHECK(c.model.input_shape == train.sample_shape(),
                "config key model.input_shape = ", shape_str(c.model.input_shape),
                " does not match the samples of data.dataset \"", dataset, "\" (",
                shape_str(train.sample_shape()), ")");
  DPTRAIN_CHECK(train.class_names() == test.class_names(), c.data.dir, ": the training split has ",
                train.class_names().size(), " classes and the test split ", test.class_names().size(),
                ", or other names; both need the same class folders");
  const bool regression = train.target_width() > 0;
  DPTRAIN_CHECK(c.model.loss == LossKind::kMse || !regression, "data.dataset \"", dataset,
                "\" is a regression dataset; set model.loss to \"mse\"");
  DPTRAIN_CHECK(
      c.model.loss == LossKind::kCrossEntropy || regression,
      "model.loss \"mse\" needs a regression dataset (data.dataset \"linear\"); use \"cross_entropy\" for "
      "classes");
  // At set-up, naming what to change: the loss's own check fires only when a batch first holds such a
  // label, which may be many steps into a run.
  const Shape outputs = model.output_shape(c.model.input_shape);
  DPTRAIN_CHECK(regression || outputs.size() != 1 || outputs[0] >= train.num_classes(), "the model has ",
                outputs[0], " outputs and data.dataset \"", dataset, "\" has ", train.num_classes(),
                " classes; ",
                c.model.architecture.empty() ? "give its last dense layer out_features "
                                             : "set config key model.num_classes to ",
                train.num_classes());
  // Deterministic mode's sampler takes a step's backward passes as one batch.
  const int64_t passes = c.distributed.deterministic ? c.distributed.backward_passes_per_step : 1;
  DPTRAIN_CHECK(sampler.steps_per_epoch() > 0, "data.batch_size ", c.data.batch_size,
                passes > 1 ? " x " + std::to_string(passes) + " backward passes" : std::string(), " x ",
                world.size(), " rank(s) = ", c.data.batch_size * passes * world.size(),
                " samples a step, more than the ", train.size(),
                " training samples, and data.drop_last drops a short step: lower data.batch_size, or set "
                "data.drop_last to false");
  DPTRAIN_CHECK(train.size() >= world.size(), "only ", train.size(), " training samples for ", world.size(),
                " ranks: every rank needs at least one sample per step");
}

std::unique_ptr<optim::LrSchedule> make_schedule(const Config& c, const distributed::World& world) {
  return std::make_unique<optim::LrSchedule>(optim::ScheduleOptions{
      .base_lr = c.optimizer.lr,
      .scaling = c.optimizer.lr_scaling,
      .world_size = world.size(),
      .backward_passes_per_step = static_cast<int>(c.distributed.backward_passes_per_step),
      .warmup_epochs = c.optimizer.warmup_epochs,
      .decay = c.optimizer.schedule,
      .step_size_epochs = c.optimizer.step_size_epochs,
      .gamma = c.optimizer.gamma,
      .total_epochs = static_cast<double>(c.training.epochs),
      .min_lr = c.optimizer.min_lr});
}

distributed::GradientSyncOptions gradient_sync_options(const Config& c) {
  const DistributedConfig& d = c.distributed;
  const std::string& compression = c.distributed.compression;
  const std::vector<std::string> encodings = distributed::gradient_encoding_names();
  return {.encoding = std::ranges::find(encodings, compression) != encodings.end() ? compression : "none",
          .fusion_threshold_mb = d.fusion_threshold_mb,
          .first_bucket_mb = d.first_bucket_mb,
          .overlap = d.overlap,
          .check_finite = d.check_finite,
          .shard_optimizer = d.shard_optimizer,
          .powersgd = {.rank = d.powersgd.rank,
                       .start_step = d.powersgd.start_step,
                       .min_compression_rate = d.powersgd.min_compression_rate,
                       .seed = c.seed,
                       .check_finite = d.check_finite},
          .micro_batch_samples = d.deterministic_micro_batch};
}

// This process's peak resident set (VmHWM) in bytes, or 0 where /proc does not say.
int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}

// The process-wide settings of the host: threads, and the CPU backend's switches.
void use_host(const Config& config, const distributed::World& world) {
  set_cpu_options(
      {.winograd = config.cpu.winograd, .winograd_tile = static_cast<int>(config.cpu.winograd_tile)});
  const int threads = threads_for_this_process(config.threads, world.local_size());
  const int allowed_cpus = allowed_cpus_of_this_process();
  if (threads > allowed_cpus && world.rank() == 0)
    std::fprintf(stderr,
                 "dptrain: warning: threads = %d, but rank 0 is bound to %d CPU(s), where its threads "
                 "will take turns; mpirun binds each of 2 or fewer ranks to one core: add --bind-to none "
                 "or --map-by socket:PE=%d\n",
                 threads, allowed_cpus, threads);
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
          world,
          distributed::StallPolicy{.warning_s = config.distributed.stall_warning_s,
                                   .abort_s = stall_abort_seconds(config.distributed, false)},
          config.distributed.shared_memory)),
      device_comm_(make_device_communicator(config, device_, *comm_)),
      state_comm_(device_comm_ ? device_comm_.get() : comm_.get()),
      model_(build_model(config.model, config.seed)),
      train_set_(open_dataset(config, *model_, true)),
      test_set_(open_dataset(config, *model_, false)),
      deterministic_(config.distributed.deterministic),
      sampler_(train_set_->size(),
               config.data.batch_size * (deterministic_ ? config.distributed.backward_passes_per_step : 1),
               world.rank(), world.size(), config.seed, config.data.shuffle, config.data.drop_last,
               deterministic_ ? config.distributed.deterministic_micro_batch : 0),
      batches_per_step_(deterministic_ ? 1 : config.distributed.backward_passes_per_step),
      progress_(world.is_root(), config.training.progress, config.training.log_every_steps),
      fault_(InjectedFault::from_environment()),
      checkpoints_(config.checkpoint, world.rank(), fault_) {
  check_data_fits(config, *model_, *train_set_, *test_set_, sampler_, world);
  train_loader_ = std::make_unique<data::BatchLoader>(
      *train_set_, loader_options(config, *train_set_, world, device_, true));
  test_loader_ = std::make_unique<data::BatchLoader>(
      *test_set_, loader_options(config, *test_set_, world, device_, false));
  const BufferAllocator reduction_buffer = [&](std::size_t bytes) {
    return state_comm_->allocate_reduction_buffer(bytes, device_);
  };
  // A sharded optimizer's ranks all-gather the updated parameters: in shared memory where the
  // gradients are reduced there.
  parameters_ = std::make_unique<FlatParameters>(
      model_->named_parameters(), device_, reduction_buffer,
      config.distributed.shard_optimizer && world.size() > 1 ? reduction_buffer : BufferAllocator{});
  buffers_ = std::make_unique<FlatParameters>(model_->named_buffers(), device_);
  if (config.distributed.sync_batchnorm && world.size() > 1) {
    batch_stats_sync_ = std::make_unique<distributed::CommunicatorSum>(*state_comm_);
    model_->sync_batch_statistics(batch_stats_sync_.get());
  }
  schedule_ = make_schedule(config, world);
  if (deterministic_) {
    DPTRAIN_CHECK(device_.is_host(),
                  "config key distributed.deterministic runs on the CPU; this run's device is ",
                  device_.str());
    DPTRAIN_CHECK(buffers_->size() == 0,
                  "config key distributed.deterministic does not take BatchNorm layers: their running "
                  "statistics would follow whichever rank holds which micro-batch");
  }
  gradient_sync_ =
      distributed::make_gradient_sync(gradient_sync_of(config), {.comm = *state_comm_,
                                                                 .host_comm = *comm_,
                                                                 .parameters = *parameters_,
                                                                 .options = gradient_sync_options(config)});
  // After the gradient sync: a sharded one says which ranges this rank's optimizer keeps state for.
  optimizer_ = make_optimizer(config.optimizer, *parameters_, gradient_sync_->optimizer_shard());
  // On a GPU the gradient check flags a step on the device, and the update reads the flag there.
  optimizer_->skip_updates_while_set(gradient_sync_->update_skip_flag());
  train_metrics_ = std::make_unique<StepMetrics>(device_, config.model.loss == LossKind::kCrossEntropy);
}

// Unwinding from an error, the members below free the gradient buffers that queued collectives name
// before comm_, declared first, goes: none of those may start, and one running gets a second to end.
// One that outlasts it (its peers late, not gone) could still complete into the gradients, the
// parameters or the reducer's wire buffers and flags: those are kept, never freed, until the abort
// that follows; reachable from a static, so that a leak checker does not report them (and nothing
// is allocated while unwinding).
Trainer::~Trainer() {
  if (std::uncaught_exceptions() == 0) return;
  const auto grace = std::chrono::seconds(1);
  bool idle = comm_->abandon_queued(grace);
  if (device_comm_) idle = device_comm_->abandon_queued(grace) && idle;
  if (idle) return;
  [[maybe_unused]] static const void* volatile kept_until_abort[2];  // volatile: the stores stay
  kept_until_abort[0] = gradient_sync_.release();
  kept_until_abort[1] = parameters_.release();
}

void Trainer::start(const RunOptions& options) {
  if (world_.is_root()) {
    if (!options.resume.empty()) resume(options.resume);
    if (!config_.model.init_from.empty() && !resumed_) init_from(config_.model.init_from);
  }
  position_.optimizer_steps = optimizer_->steps_taken();
  int64_t scalars[] = {position_.optimizer_steps, position_.epochs_completed, position_.epoch_samples_done,
                       position_.global_step,     position_.samples_seen,     resumed_};
  std::vector<Tensor> state = {parameters_->values(), buffers_->values()};
  // A sharded optimizer's buffers differ by rank: its state goes out whole below, if resumed.
  if (!optimizer_->sharded())
    for (const Tensor& slot : optimizer_->state_buffers()) state.push_back(slot);
  distributed::broadcast_state(*comm_, *state_comm_, state, std::span<int64_t>(scalars));
  if (optimizer_->sharded() && scalars[5] != 0) {
    if (!world_.is_root()) whole_optimizer_state_ = optimizer_->whole_state_buffers();
    distributed::broadcast_state(*comm_, *state_comm_, whole_optimizer_state_, {});
    optimizer_->take_state_from(whole_optimizer_state_);
  }
  whole_optimizer_state_.clear();  // the memory sharding saves
  gradient_sync_->share_state_from_rank0();
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

// A run stopped by a signal left its checkpoint for --resume auto: a fresh start would remove it
// (clear_earlier), and a relaunch that forgot --resume would lose the work of a preempted job.
void Trainer::refuse_to_discard_a_stopped_run() const {
  const std::string note_path = stop_note_path(config_);
  std::ifstream in(note_path);
  if (!in) return;
  const Json note = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::string what = "a run stopped with a checkpoint";
  if (note.is_object() && note.value("stopped_by", Json()).is_string() &&
      note.value("global_step", Json()).is_number_integer())
    what = "a run stopped by " + note["stopped_by"].get<std::string>() + " after step " +
           std::to_string(note["global_step"].get<int64_t>()) + ", with its checkpoint";
  DPTRAIN_FAIL(note_path, ": ", what, "; continue it with --resume auto, or remove ", note_path,
               " to start afresh (which removes the checkpoints in ", config_.checkpoint.dir, ")");
}

TrainingResult Trainer::run() {
  run_start_ = Clock::now();
  if (world_.is_root()) {
    if (!resumed_) refuse_to_discard_a_stopped_run();
    std::filesystem::remove(stop_note_path(config_));  // a previous run's: this one decides anew
    const std::string cleared =
        resumed_ ? checkpoints_.set_aside_after(position_.global_step) : checkpoints_.clear_earlier();
    if (!cleared.empty()) std::printf("%s\n", cleared.c_str());
    print_summary(config_, summary());
  }
  MetricsLog metrics(config_, world_.is_root(),
                     resumed_ ? std::optional<int64_t>(position_.global_step) : std::nullopt);
  TrainingResult result;
  std::optional<EpochMetrics> completed_by_the_stop;
  for (int64_t epoch = position_.epochs_completed + 1;
       epoch <= config_.training.epochs && !step_limit_reached() && !stop_.any(); ++epoch) {
    EpochMetrics m = train_epoch(epoch);
    // A stop request wants the checkpoint now: the grace before SIGKILL may be a second or two. An
    // epoch that the stop's step completed is evaluated after the checkpoint and the stop note.
    if (stop_.any()) {
      if (!m.stopped_early) completed_by_the_stop = m;
      break;
    }
    evaluate_and_record(m, result, metrics);
    if (checkpoints_.due_at_epoch_end(epoch, position_.global_step, m.stopped_early)) save_checkpoint();
  }
  if (checkpoints_.due_at_end(position_.global_step)) save_checkpoint();
  if (stop_.any()) {
    result.stopped_by = stop_.describe();
    write_stop_note(result.stopped_by);
    // The resume starts at the next epoch: this one's evaluation and metrics line come now or never. A
    // SIGKILL in the evaluation costs only them.
    if (completed_by_the_stop) evaluate_and_record(*completed_by_the_stop, result, metrics);
    return result;
  }
  if (world_.is_root()) {
    const std::string path = config_.output_dir + "/model.safetensors";
    std::filesystem::create_directories(config_.output_dir);
    std::vector<NamedTensor> weights;
    for (const NamedTensor& p : model_state())
      weights.push_back({p.name, p.tensor.to(Device::cpu()), p.stored});
    write_file_durably(path, safetensors::serialize(weights, {{"format", "pt"}, {"producer", "dptrain"}}));
    print_run_end(config_, result.epochs, seconds_since(run_start_));
    std::printf("final weights: %s\n", path.c_str());
  }
  if (!config_.distributed.timeline.empty()) write_timeline(*comm_, config_.distributed.timeline);
  return result;
}

void Trainer::evaluate_and_record(EpochMetrics& m, TrainingResult& result, MetricsLog& metrics) {
  const Evaluation e = evaluate();
  m.test_loss = e.loss;
  m.test_accuracy = e.accuracy;
  result.epochs.push_back(m);
  if (world_.is_root()) print_epoch(config_, world_.size(), m);
  metrics.write(m, world_.size());
}

EpochMetrics Trainer::train_epoch(int64_t epoch) {
  const int64_t first_sample = epoch == position_.epochs_completed + 1 ? position_.epoch_samples_done : 0;
  sampler_.set_epoch(epoch - 1, first_sample);
  start_loading(epoch - 1);
  model_->set_training(true);
  const int64_t steps = optimizer_steps_per_epoch();
  progress_.begin_epoch(epoch, config_.training.epochs, steps);
  StepTotals totals;
  const auto start = Clock::now();
  int64_t step = 0;
  for (; step < steps && !step_limit_reached() && !stop_.any(); ++step) {
    fault_.before_step(world_.rank(), position_.global_step);
    train_step(epoch, step, totals);
    // The metrics are read from the device only when shown: every log_every_steps on every rank, and
    // when rank 0's progress is drawn. A deferred gradient check runs at the log steps alone, which are
    // the same on every rank, so that it stops all ranks at one step.
    const bool log_step = (step + 1) % config_.training.log_every_steps == 0;
    if (log_step || progress_.due(step)) {
      flush_metrics(totals, /*check_gradients=*/log_step);
      progress_.update(
          step, totals.loss_sum.value() / totals.samples,
          config_.model.loss == LossKind::kMse ? -1.0 : static_cast<double>(totals.correct) / totals.samples,
          totals.samples * world_.size() / seconds_since(start),
          config_.optimizer.max_grad_norm > 0 ? totals.clipping.last_norm : -1.0,
          {.run_seconds = seconds_since(run_start_),
           .epoch_seconds = seconds_since(start),
           .steps_left = steps_left_after(epoch, step, steps)});
    }
    stop_ = agree_on_stop();
    const bool epoch_ends = step + 1 == steps || step_limit_reached() || stop_.any();
    if (!epoch_ends && checkpoints_.due_after_step(position_.global_step)) save_checkpoint();
  }
  flush_metrics(totals);  // the device's work is done from here: the epoch's time includes it
  progress_.end_epoch();
  report_bad_samples(*train_loader_, "epoch " + std::to_string(epoch));
  if (step == steps) {
    position_.epochs_completed = epoch;
    position_.epoch_samples_done = 0;
  }
  return allreduce_epoch_metrics(epoch, totals, first_sample, seconds_since(start), step < steps);
}

EpochMetrics Trainer::allreduce_epoch_metrics(int64_t epoch, const StepTotals& totals, int64_t first_sample,
                                              double epoch_seconds, bool stopped_early) {
  EpochMetrics m;
  m.epoch = epoch;
  m.step = position_.global_step;
  m.lr = lr_;
  m.epoch_seconds = epoch_seconds;
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
  m.stopped_early = stopped_early;
  m.optimizer_state_bytes = optimizer_->state_bytes();
  if (config_.optimizer.max_grad_norm > 0) m.clipping = totals.clipping;
  // Before this epoch's checkpoint: what training itself needs (a checkpoint of a sharded optimizer
  // gathers its state whole for a moment).
  m.peak_resident_bytes = peak_resident_bytes();
  comm_->allreduce(std::span<int64_t>(&m.peak_resident_bytes, 1), distributed::ReduceOp::kMax,
                   "allreduce of the peak resident memory");
  m.gradient_bytes_per_step =
      static_cast<double>(totals.payload_bytes) / static_cast<double>(std::max<int64_t>(totals.steps, 1));
  return m;
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
  const int64_t n = test_set_->size(), r = world_.rank(), size = world_.size(),
                chunk = config_.data.eval_batch_size, chunks = (n + chunk - 1) / chunk;
  const int64_t begin = std::min(n, chunks * r / size * chunk),
                end = std::min(n, chunks * (r + 1) / size * chunk);
  const bool mse = config_.model.loss == LossKind::kMse;
  distributed::ExactScalarSum loss_sum;
  int64_t correct = 0;
  StepMetrics metrics(device_, !mse);
  test_indices_.resize(static_cast<std::size_t>(n));
  std::iota(test_indices_.begin(), test_indices_.end(), 0);
  std::vector<std::span<const int64_t>> batches;
  for (int64_t first = begin; first < end; first += chunk)
    batches.push_back(std::span<const int64_t>(test_indices_)
                          .subspan(static_cast<std::size_t>(first),
                                   static_cast<std::size_t>(std::min(end, first + chunk) - first)));
  test_loader_->start(0, batches);
  for (const std::span<const int64_t> indices : batches) {
    load_batch(*test_loader_, indices);
    const Tensor output = model_->forward(batch_.inputs);
    metrics.add(loss_of(output), output, batch_.labels, loss_sum, correct);
  }
  metrics.flush(loss_sum, correct);
  report_bad_samples(*test_loader_, "evaluation");
  loss_sum.allreduce(*comm_, "allreduce of the evaluation loss");
  comm_->allreduce(std::span<int64_t>(&correct, 1), distributed::ReduceOp::kSum,
                   "allreduce of correct predictions");
  return {.loss = loss_sum.value() / static_cast<double>(n),
          .accuracy = mse ? 0.0 : static_cast<double>(correct) / static_cast<double>(n),
          .correct = correct,
          .samples = n};
}

// A checkpoint (validated) or a file of weights alone, such as a run's model.safetensors, as
// model.init_from reads them.
Evaluation Trainer::evaluate_checkpoint(const std::string& path) {
  if (world_.is_root()) init_from(path);
  int64_t none = 0;
  distributed::broadcast_state(*comm_, *state_comm_, {parameters_->values(), buffers_->values()},
                               std::span<int64_t>(&none, 1));
  const Evaluation e = evaluate();
  if (world_.is_root()) print_evaluation(config_, world_.size(), path, e);
  return e;
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

std::vector<NamedTensor> Trainer::model_state() const {
  return layers::state_tensors(*model_);
}

bool Trainer::step_limit_reached() const {
  return config_.training.max_steps > 0 && position_.global_step >= config_.training.max_steps;
}

int64_t Trainer::steps_left_after(int64_t epoch, int64_t step, int64_t steps) const {
  return run_steps_left(steps, step + 1, config_.training.epochs - epoch, optimizer_steps_per_epoch(),
                        config_.training.max_steps, position_.global_step);
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

int64_t Trainer::global_batch() const {
  return config_.data.batch_size * world_.size() * config_.distributed.backward_passes_per_step;
}

// A last group of fewer than batches_per_step_ batches is a step of its own (plan_step takes what is
// left), as the sampler's short last batch is.
int64_t Trainer::optimizer_steps_per_epoch() const {
  return (sampler_.steps_per_epoch() + batches_per_step_ - 1) / batches_per_step_;
}

RunSummary Trainer::summary() const {
  return {.ranks = world_.size(),
          .hosts = world_.hosts(),
          .threads = omp_get_max_threads(),
          .device = device_.str(),
          .parameters_checksum = checksum_,
          .parameters = layers::parameter_count(*model_),
          .model_description = model_->describe(),
          .train_samples = train_set_->size(),
          .test_samples = test_set_->size(),
          .global_batch = global_batch(),
          .steps_per_epoch = optimizer_steps_per_epoch(),
          .loader = describe_loader(config_, *train_loader_),
          .gradient_sync = gradient_sync_->describe(),
          .scaled_lr = schedule_->scaled_lr(),
          .optimizer = config_.optimizer.type,
          .optimizer_state_bytes = optimizer_->state_bytes(),
          .optimizer_state_bytes_all = static_cast<int64_t>(optimizer_->state_buffers().size()) *
                                       parameters_->size() * static_cast<int64_t>(sizeof(float)),
          .already_complete = config_.training.epochs <= position_.epochs_completed || step_limit_reached(),
          .global_step = position_.global_step};
}

// ---- the interface of run.h ----

TrainingResult train(const Config& config, const distributed::World& world, const RunOptions& options) {
  use_host(config, world);
  // Before anything reads or clears checkpoints: a second job on these directories stops here.
  std::vector<std::unique_ptr<DirectoryLock>> locks;
  if (world.is_root()) {
    const auto report = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    for (const auto& [dir, key] : run_directories(config))
      locks.push_back(std::make_unique<DirectoryLock>(dir, key, report));
  }
  Trainer trainer(config, world);
  trainer.start(options);
  if (options.before_first_step) options.before_first_step();
  return trainer.run();
}

BenchmarkResult benchmark(const Config& config, const distributed::World& world,
                          const BenchmarkOptions& options) {
  use_host(config, world);
  Trainer trainer(config, world);
  trainer.start({});
  return trainer.benchmark(options);
}

Evaluation evaluate_checkpoint(const Config& config, const distributed::World& world,
                               const std::string& checkpoint) {
  use_host(config, world);
  Trainer trainer(config, world);
  return trainer.evaluate_checkpoint(checkpoint);
}

}  // namespace dptrain::trainer
