// The training loop, top to bottom. One optimizer step:
//   sampler -> batch -> forward (the tape records) -> loss -> backward
//     -> as each gradient bucket fills: [compress] -> allreduce (async) -> ... wait all -> average
//     -> optimizer.step(lr from the schedule) -> metrics
// Before the first step every rank takes rank 0's parameters and optimizer state.
#include "trainer/train.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "distributed/communicator.h"
#include "distributed/reducer.h"
#include "distributed/state_sync.h"
#include "layers/build.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "trainer/progress.h"

namespace dptrain::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

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
  return data::load_image_dataset(c.data.dir, train, static_cast<float>(c.data.mean), static_cast<float>(c.data.std));
}

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizerConfig& o, std::vector<NamedTensor> parameters) {
  if (o.type == "sgd") {
    return std::make_unique<optim::Sgd>(
        std::move(parameters),
        optim::SgdOptions{static_cast<float>(o.momentum), static_cast<float>(o.dampening), o.nesterov,
                          static_cast<float>(o.weight_decay)});
  }
  return std::make_unique<optim::Adam>(
      std::move(parameters), optim::AdamOptions{static_cast<float>(o.betas[0]), static_cast<float>(o.betas[1]),
                                                static_cast<float>(o.eps), static_cast<float>(o.weight_decay),
                                                o.type == "adamw"});
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

// DPTRAIN_INJECT_FAULT=RANK:STEP makes that rank throw at that optimizer step: the test of the
// "one rank fails, the whole job stops" guarantee. Unset in normal use.
struct InjectedFault {
  int rank = -1;
  int64_t step = -1;
};
InjectedFault injected_fault() {
  InjectedFault f;
  if (const char* spec = std::getenv("DPTRAIN_INJECT_FAULT"))
    DPTRAIN_CHECK(std::sscanf(spec, "%d:%ld", &f.rank, &f.step) == 2, "DPTRAIN_INJECT_FAULT='", spec,
                  "': expected RANK:STEP");
  return f;
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
        progress_(world.is_root(), config.training.log_every_steps),
        fault_(injected_fault()) {
    DPTRAIN_CHECK(config.model.input_shape == train_set_.sample_shape, "config key model.input_shape = ",
                  shape_str(config.model.input_shape), " does not match the samples of data.dataset \"",
                  config.data.dataset, "\" (", shape_str(train_set_.sample_shape), ")");
    DPTRAIN_CHECK(config.model.loss == "mse" || train_set_.targets.empty(), "data.dataset \"", config.data.dataset,
                  "\" is a regression dataset; set model.loss to \"mse\"");
    DPTRAIN_CHECK(config.model.loss == "cross_entropy" || !train_set_.targets.empty(), "model.loss \"mse\" needs a ",
                  "regression dataset (data.dataset \"linear\"); use \"cross_entropy\" for classes");
    DPTRAIN_CHECK(sampler_.steps_per_epoch() > 0, "data.batch_size ", config.data.batch_size, " x ", world.size(),
                  " ranks is larger than the ", train_set_.size, " training samples with data.drop_last");
    DPTRAIN_CHECK(train_set_.size >= world.size(), "only ", train_set_.size, " training samples for ", world.size(),
                  " ranks: every rank needs at least one sample per step");

    model_ = layers::build_sequential(config.model.layers, config.model.input_shape, config.seed);
    if (!config.model.init_from.empty())
      layers::load_parameters(*model_, safetensors::load(config.model.init_from), config.model.init_from);
    optimizer_ = make_optimizer(config.optimizer, model_->named_parameters());
    schedule_ = std::make_unique<optim::LrSchedule>(optim::ScheduleOptions{
        config.optimizer.lr, config.optimizer.lr_scaling, world.size(), static_cast<int>(passes_per_step_),
        config.optimizer.warmup_epochs, config.optimizer.schedule, config.optimizer.step_size_epochs,
        config.optimizer.gamma, static_cast<double>(config.training.epochs), config.optimizer.min_lr});
    reducer_ = std::make_unique<distributed::GradientReducer>(
        comm_, model_->named_parameters(),
        distributed::ReducerOptions{config.distributed.fusion_threshold_mb, config.distributed.first_bucket_mb,
                                    config.distributed.overlap,
                                    distributed::parse_compression(config.distributed.compression),
                                    /*gradients_prescaled=*/true, config.distributed.check_finite});
    // All ranks start from rank 0's parameters and optimizer state, whatever they initialised.
    int64_t steps = optimizer_->steps_taken();
    distributed::broadcast_state(comm_, optimizer_->parameters(), optimizer_->state(), std::span<int64_t>(&steps, 1));
    optimizer_->set_steps_taken(steps);
    checksum_ = distributed::verify_identical(comm_, optimizer_->parameters());
  }

  std::vector<EpochMetrics> run() {
    announce();
    std::vector<EpochMetrics> history;
    std::ofstream metrics = open_metrics();
    for (int64_t epoch = 1; epoch <= config_.training.epochs && !step_limit_reached(); ++epoch) {
      EpochMetrics m = train_epoch(epoch);
      evaluate(m);
      history.push_back(m);
      if (world_.is_root()) {
        report(m);
        write_metrics(metrics, m);
      }
    }
    if (world_.is_root()) save_final_weights();
    return history;
  }

 private:
  bool step_limit_reached() const {
    return config_.training.max_steps > 0 && global_step_ >= config_.training.max_steps;
  }

  EpochMetrics train_epoch(int64_t epoch) {
    sampler_.set_epoch(epoch - 1);
    model_->set_training(true);
    const int64_t batches = sampler_.steps_per_epoch();
    const int64_t steps = (batches + passes_per_step_ - 1) / passes_per_step_;
    progress_.begin_epoch(epoch, config_.training.epochs, steps);
    double loss_sum = 0;
    int64_t correct = 0, samples = 0;
    const auto start = Clock::now();
    for (int64_t step = 0; step < steps && !step_limit_reached(); ++step) {
      const int64_t first_batch = step * passes_per_step_;
      const int64_t passes = std::min(passes_per_step_, batches - first_batch);
      lr_ = schedule_->at(static_cast<double>(epoch - 1) + static_cast<double>(first_batch) / batches);
      if (global_step_ == fault_.step && world_.rank() == fault_.rank)
        DPTRAIN_FAIL("fault injected by DPTRAIN_INJECT_FAULT at step ", global_step_);

      // --- one optimizer step ---
      optimizer_->zero_grad();
      for (int64_t pass = 0; pass < passes; ++pass) {
        fill_batch(train_set_, sampler_.batch_indices(first_batch + pass), batch_);
        Tensor output = model_->forward(batch_.inputs);
        Tensor loss = config_.model.loss == "mse" ? ops::mse(output, batch_.targets)
                                                  : ops::cross_entropy(output, batch_.labels);
        if (pass == passes - 1) reducer_->prepare(global_step_);  // buckets launch during this backward
        // The step averages its passes and the ranks: seeding backward with 1 / (passes x ranks)
        // makes the allreduce's sum the average, with no extra pass over the gradients.
        loss.backward(1.0f / static_cast<float>(passes * world_.size()));
        const int64_t n = batch_.inputs.dim(0);
        loss_sum += static_cast<double>(loss.item()) * n;
        if (config_.model.loss == "cross_entropy") correct += count_correct(output, batch_.labels);
        samples += n;
      }
      reducer_->finish();  // gradients are now the average over all ranks
      optimizer_->step(static_cast<float>(lr_));
      ++global_step_;

      progress_.update(step, loss_sum / samples,
                       config_.model.loss == "mse" ? -1.0 : static_cast<double>(correct) / samples,
                       samples * world_.size() / seconds_since(start));
    }
    progress_.end_epoch();

    EpochMetrics m;
    m.epoch = epoch;
    m.step = global_step_;
    m.lr = lr_;
    m.epoch_seconds = seconds_since(start);
    // Weighted by sample counts: ranks may hold different batch sizes in an epoch's last step.
    double totals[3] = {loss_sum, static_cast<double>(correct), static_cast<double>(samples)};
    comm_.allreduce(std::span<double>(totals), distributed::ReduceOp::kSum, "allreduce of epoch metrics");
    m.train_loss = totals[0] / std::max(totals[2], 1.0);
    m.train_accuracy = totals[1] / std::max(totals[2], 1.0);
    m.samples_per_sec = totals[2] / m.epoch_seconds;
    m.samples_per_sec_per_rank = m.samples_per_sec / world_.size();
    m.stopped_early = step_limit_reached() && global_step_ % steps != 0;
    return m;
  }

  // Each rank evaluates a contiguous slice of the test set; the sums are combined across ranks.
  void evaluate(EpochMetrics& m) {
    NoGradGuard no_grad;
    model_->set_training(false);
    const int64_t n = test_set_.size, r = world_.rank(), size = world_.size();
    const int64_t begin = n * r / size, end = n * (r + 1) / size;
    double loss_sum = 0, correct = 0;
    std::vector<int64_t> indices;
    for (int64_t first = begin; first < end; first += config_.data.eval_batch_size) {
      const int64_t last = std::min(end, first + config_.data.eval_batch_size);
      indices.resize(last - first);
      for (int64_t i = first; i < last; ++i) indices[i - first] = i;
      fill_batch(test_set_, indices, batch_);
      Tensor output = model_->forward(batch_.inputs);
      const bool mse = config_.model.loss == "mse";
      loss_sum += static_cast<double>((mse ? ops::mse(output, batch_.targets) : ops::cross_entropy(output, batch_.labels)).item()) *
                  (last - first);
      if (!mse) correct += static_cast<double>(count_correct(output, batch_.labels));
    }
    double totals[2] = {loss_sum, correct};
    comm_.allreduce(std::span<double>(totals), distributed::ReduceOp::kSum, "allreduce of evaluation metrics");
    m.test_loss = totals[0] / n;
    m.test_accuracy = totals[1] / n;
  }

  void announce() {
    if (!world_.is_root()) return;
    std::printf("dptrain: %d rank(s), %d thread(s) per rank; parameters identical on %d rank(s) (checksum %016llx)\n",
                world_.size(), omp_get_max_threads(), world_.size(), static_cast<unsigned long long>(checksum_));
    std::printf("model: %lld parameters\n%s", static_cast<long long>(layers::parameter_count(*model_)),
                model_->describe().c_str());
    std::printf("data: %s, %lld training and %lld test samples; batch %lld per rank (%lld global)",
                config_.data.dataset == "linear" ? "linear (synthetic)" : config_.data.dir.c_str(),
                static_cast<long long>(train_set_.size), static_cast<long long>(test_set_.size),
                static_cast<long long>(config_.data.batch_size),
                static_cast<long long>(config_.data.batch_size * world_.size() * passes_per_step_));
    std::printf(", %lld steps per epoch\n",
                static_cast<long long>((sampler_.steps_per_epoch() + passes_per_step_ - 1) / passes_per_step_));
    if (world_.size() > 1) {
      std::printf("gradients: %zu bucket(s), fusion threshold %g MiB, overlap %s, compression %s; lr %g scaled to %g\n",
                  reducer_->buckets().size(), config_.distributed.fusion_threshold_mb,
                  config_.distributed.overlap ? "on" : "off", config_.distributed.compression.c_str(),
                  config_.optimizer.lr, schedule_->scaled_lr());
    }
    std::fflush(stdout);
  }

  void report(const EpochMetrics& m) {
    if (config_.model.loss == "mse") {
      std::printf("epoch %lld: train loss %.6g | test loss %.6g | %.0f samples/s (%.0f per rank), %.2f s\n",
                  static_cast<long long>(m.epoch), m.train_loss, m.test_loss, m.samples_per_sec,
                  m.samples_per_sec_per_rank, m.epoch_seconds);
    } else {
      std::printf("epoch %lld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f samples/s (%.0f per "
                  "rank), %.1f s\n",
                  static_cast<long long>(m.epoch), m.train_loss, 100 * m.train_accuracy, m.test_loss,
                  100 * m.test_accuracy, m.samples_per_sec, m.samples_per_sec_per_rank, m.epoch_seconds);
    }
    std::fflush(stdout);
  }

  std::ofstream open_metrics() {
    if (!world_.is_root()) return {};
    std::filesystem::create_directories(config_.output_dir);
    const std::string path = config_.output_dir + "/metrics.jsonl";
    std::ofstream out(path, std::ios::trunc);
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
    out << line.dump() << '\n';
    out.flush();
  }

  void save_final_weights() {
    const std::string path = config_.output_dir + "/model.safetensors";
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
  int64_t global_step_ = 0;
  double lr_ = 0;
  uint64_t checksum_ = 0;
};

}  // namespace

std::vector<EpochMetrics> train(const Config& config, const distributed::World& world) {
  const int threads = choose_threads(config.threads, world);
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
  Trainer trainer(config, world);
  return trainer.run();
}

}  // namespace dptrain::trainer
