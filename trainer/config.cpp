// Config parsing, overrides and the resolved form: one table of fields per section
// (core/config_table.h), and the rules between fields in validate().
#include "trainer/config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/config_table.h"
#include "core/error.h"
#include "core/registry.h"
#include "data/registry.h"
#include "distributed/gradient_sync.h"
#include "layers/registry.h"
#include "optim/registry.h"

namespace dptrain::trainer {
namespace {

using namespace config_table;
using Top = SectionBuilder<Config, Config>;

constexpr Names<DeviceKind> kDevices = {
    {"cpu", DeviceKind::kCpu}, {"cuda", DeviceKind::kCuda}, {"auto", DeviceKind::kAuto}};
constexpr Names<CommBackend> kCommBackends = {
    {"auto", CommBackend::kAuto}, {"nccl", CommBackend::kNccl}, {"mpi", CommBackend::kMpi}};
constexpr Names<OnBadSample> kOnBadSample = {{"error", OnBadSample::kError}, {"skip", OnBadSample::kSkip}};
constexpr Names<LossKind> kLosses = {{"cross_entropy", LossKind::kCrossEntropy}, {"mse", LossKind::kMse}};
constexpr Names<optim::LrScaling> kLrScalings = {{"linear", optim::LrScaling::kLinear},
                                                 {"none", optim::LrScaling::kNone}};
constexpr Names<optim::Decay> kSchedules = {
    {"constant", optim::Decay::kConstant}, {"step", optim::Decay::kStep}, {"cosine", optim::Decay::kCosine}};
constexpr Names<OnCheckpointError> kOnCheckpointErrors = {{"stop", OnCheckpointError::kStop},
                                                          {"warn", OnCheckpointError::kWarn}};
constexpr Names<ProgressMode> kProgressModes = {{"auto", ProgressMode::kAuto},
                                                {"bar", ProgressMode::kBar},
                                                {"lines", ProgressMode::kLines},
                                                {"off", ProgressMode::kOff}};

// ---- Where fields apply -------------------------------------------------------------------------

bool is_sgd(const Config& c) {
  return c.optimizer.type == "sgd";
}
bool has_architecture(const Config& c) {
  return !c.model.architecture.empty();
}

const When<Config> kSgdOnly{
    R"(optimizer.type = "sgd")", is_sgd, [](const std::string&, const Config& c) {
      return R"(config key optimizer.momentum/dampening/nesterov apply to "sgd" only, not ")" +
             c.optimizer.type + "\"";
    }};
// These three are accepted where they do not apply (a config may switch optimizer or schedule with one
// --set), but not printed there.
const When<Config> kAdamFamily{R"(optimizer.type != "sgd")", [](const Config& c) { return !is_sgd(c); },
                               nullptr};
const When<Config> kStepSchedule{R"(optimizer.schedule = "step")",
                                 [](const Config& c) { return c.optimizer.schedule == optim::Decay::kStep; },
                                 nullptr};
const When<Config> kCosineSchedule{
    R"(optimizer.schedule = "cosine")",
    [](const Config& c) { return c.optimizer.schedule == optim::Decay::kCosine; }, nullptr};
const When<Config> kLinearData{R"(data.dataset = "linear")",
                               [](const Config& c) { return c.data.dataset == "linear"; },
                               rule(R"(applies to data.dataset "linear" only)")};
const When<Config> kImageFolderData{R"(data.dataset = "image_folder")",
                                    [](const Config& c) { return c.data.dataset == "image_folder"; },
                                    rule(R"(applies to data.dataset "image_folder" only)")};
const When<Config> kSyntheticData{R"(data.dataset = "synthetic")",
                                  [](const Config& c) { return c.data.dataset == "synthetic"; },
                                  rule(R"(applies to data.dataset "synthetic" only)")};
const When<Config> kNamedArchitecture{
    R"(model.architecture != "")", has_architecture,
    rule("applies to model.architecture; a layer list's last layer sets the classes")};
// "" means "none": the resolved config leaves it out rather than print an empty name.
const When<Config> kArchitectureShown{R"(model.architecture != "")", has_architecture, nullptr};
const When<Config> kLayerList{
    R"(model.architecture = "")", [](const Config& c) { return !has_architecture(c); },
    [](const std::string&, const Config&) {
      return std::string("config keys model.layers and model.architecture exclude each other; keep one");
    }};
const When<Config> kDeterministic{"distributed.deterministic = true",
                                  [](const Config& c) { return c.distributed.deterministic; },
                                  rule("applies with distributed.deterministic = true only")};
const When<Config> kPowerSgd{R"(distributed.compression = "powersgd" (or distributed.gradient_sync))",
                             [](const Config& c) { return gradient_sync_of(c) == "powersgd"; },
                             rule(R"(applies with distributed.compression = "powersgd" only)")};

// "auto", then every registered strategy.
std::vector<std::string> gradient_sync_choices() {
  std::vector<std::string> names = {"auto"};
  for (const std::string& name : distributed::gradient_sync_names()) names.push_back(name);
  return names;
}

// ---- Defaults that depend on fields before them, and checks of single values --------------------------

// "`data/mnist` for mnist, ...": each registered format's own folder.
std::string default_dirs_doc() {
  std::string doc;
  for (const std::string& name : data::dataset_names()) {
    const std::string dir = data::dataset_format(name).default_dir;
    if (!dir.empty()) doc += (doc.empty() ? "`\"" : ", `\"") + dir + "\"` for " + name;
  }
  return doc + "; `\"\"` for generated data";
}

const auto kDataDir =
    computed("the format's own folder (data/registry.cpp): " + default_dirs_doc(),
             [](const Config& c) { return std::string(data::dataset_format(c.data.dataset).default_dir); });
const auto kLr =
    computed("`0.01` for sgd, else `0.001`", [](const Config& c) { return is_sgd(c) ? 0.01 : 1e-3; });
const auto kWeightDecay = computed("`0.01` for adamw, else `0.0`",
                                   [](const Config& c) { return c.optimizer.type == "adamw" ? 1e-2 : 0.0; });
const auto kCheckpointDir =
    computed("`<output_dir>/checkpoints`", [](const Config& c) { return c.output_dir + "/checkpoints"; });

const Check<double> kPositive{"> 0", [](const double& v) {
                                std::ostringstream s;
                                if (!(v > 0)) s << " = " << v << " must be > 0";
                                return s.str();
                              }};
const Check<std::string> kNonEmptyText{
    "non-empty", [](const std::string& v) { return std::string(v.empty() ? " must not be empty" : ""); }};
const Check<std::vector<double>> kNonEmptyList{"non-empty", [](const std::vector<double>& v) {
                                                 return std::string(v.empty() ? " must not be empty" : "");
                                               }};
Check<Json> per_channel(bool positive) {
  return {positive ? "a number > 0, or a non-empty list of them (one per channel)"
                   : "a number, or a non-empty list of numbers (one per channel)",
          [positive](const Json& v) -> std::string {
            const bool number = v.is_number(), list = v.is_array() && !v.empty();
            if (!number && !list) return " must be a number or a non-empty list of numbers, one per channel";
            for (const Json& x : list ? v : Json::array({v})) {
              if (!x.is_number()) return " must hold numbers only";
              if (positive && !(x.get<double>() > 0)) return " = " + v.dump() + ": every value must be > 0";
            }
            return "";
          }};
}
// Rank 0 validates the config alone: an unknown architecture found only when every rank builds the
// model would be reported by each of them.
const Check<std::string> kArchitectureName{
    "`\"\"` or one of the names described", [](const std::string& name) -> std::string {
      return name.empty() ? "" : layers::architecture_name_problem(name);
    }};
const Check<Shape> kShape{"non-empty; every dimension > 0", [](const Shape& shape) -> std::string {
                            if (shape.empty()) return " must not be empty";
                            for (int64_t d : shape)
                              if (d <= 0) return ": dimensions must be > 0";
                            return "";
                          }};
const Check<int64_t> kWinogradTile{"2 or 4", [](const int64_t& v) {
                                     return v == 2 || v == 4 ? std::string()
                                                             : " = " + std::to_string(v) + " must be 2 or 4";
                                   }};
// -1 (the default: by backend), or seconds; a value between them has no meaning.
const Check<double> kStallAbort{"-1, or [0, 1e9]", [](const double& v) {
                                  std::ostringstream s;
                                  if (v != kStallAbortAuto && !(v >= 0 && v <= 1e9))
                                    s << " = " << v << " must be -1 (by backend) or seconds in [0, 1e9]";
                                  return s.str();
                                }};
const Check<std::vector<double>> kBetas{"two numbers in [0, 1)", [](const std::vector<double>& b) {
                                          const bool ok =
                                              b.size() == 2 && b[0] >= 0 && b[0] < 1 && b[1] >= 0 && b[1] < 1;
                                          return std::string(ok ? "" : " must be two numbers in [0, 1)");
                                        }};

// ---- The tables: key, member, default, allowed values, doc[, where it applies] ----------------------

void declare_top(Top t) {
  t.field("seed", &Config::seed, 0, Range{0, UINT64_MAX}, "Seeds initialisation, shuffling and dropout.");
  t.field("output_dir", &Config::output_dir, "runs/default", Any{},
          "Metrics, final weights and (by default) checkpoints go here. Relative paths here and in "
          "data.dir start from the current directory, not the config file's.");
  t.field("threads", &Config::threads, 0, Range{0, 1024},
          "CPU threads per rank; 0: SLURM_CPUS_PER_TASK where Slurm sets it, else the host's cores / its "
          "ranks, either at most the CPUs the rank is bound to (its affinity mask).");
  t.field("device", &Config::device, DeviceKind::kCpu, kDevices,
          "`cuda`: rank r on GPU local_rank; `auto`: CUDA when built and a GPU is present.");
  auto cpu = t.section("cpu", &Config::cpu, "Switches of the CPU backend.");
  cpu.field("winograd", &CpuConfig::winograd, true, Any{},
            "3x3 convolutions at stride 1 and padding 1 over planes of 8x8 and more (4x4 with "
            "`cpu.winograd_tile` 4) by Winograd's minimal filtering: fewer products, rounded differently "
            "from the direct form; off: the direct and im2col forms. docs/design.md.");
  cpu.field(
      "winograd_tile", &CpuConfig::winograd_tile, 2, kWinogradTile,
      "Outputs a side of Winograd's tiles in the forward and the input gradient. `2`: F(2x2, 3x3), 4 "
      "products per output and channel pair where the direct form makes 9, relative errors of 2-3e-7 "
      "against exact sums (1.5-2x the direct form's). `4`: F(4x4, 3x3), 2.25 products, errors of "
      "1-2e-6, also over planes of 4x4 to 7x7; 3-6% more resnet18 and ResNet-50 images a second, "
      "but its roundings compound through the layers: three SGD steps of resnet20 end 2.9e-5 from "
      "PyTorch's, outside the 1e-5 its fixture holds the default to. The weight gradient is F(4x4, 3x3)'s "
      "either way, but for `2` only where its tiles cover no more of the plane than F(2x2, 3x3)'s "
      "(not over 14x14, say).");
  auto cuda = t.section("cuda", &Config::cuda, "Switches of the CUDA backend.");
  cuda.field("tf32", &CudaConfig::tf32, false, Any{}, "TF32 tensor cores for fp32 GEMMs and convolutions.");
  cuda.field("deterministic", &CudaConfig::deterministic, false, Any{},
             "Only cuDNN algorithms with run-to-run identical results.");
  cuda.field("cudnn_benchmark", &CudaConfig::cudnn_benchmark, false, Any{},
             "Time cuDNN's algorithms once per convolution shape and take the fastest "
             "(torch.backends.cudnn.benchmark); off: cuDNN's heuristics rank them.");
}

void declare_data(SectionBuilder<Config, DataConfig> d) {
  using D = DataConfig;
  d.field("dataset", &D::dataset, "mnist", Choices{data::dataset_names},
          "IDX files (`idx`, or `mnist` and `fashion_mnist` with their own default folders), NumPy files "
          "(`npy`), PNG/JPEG files in class folders (`image_folder`), CIFAR binary files (`cifar`), "
          "`linear` regression or `synthetic` images: docs/data.md.");
  d.field("dir", &D::dir, kDataDir, Any{},
          "Directory of the data set's files: IDX `train-images-idx3-ubyte` etc. (raw or .gz); npy "
          "`train_x.npy`, `train_y.npy`, `test_x.npy`, `test_y.npy`; image_folder `train/<class>/*.png` and "
          "`test/<class>/*.jpg`; cifar `data_batch_1.bin`... or `train.bin`.");
  d.field("batch_size", &D::batch_size, 128, Range{1, 1 << 20},
          "Per rank; the global batch is batch_size x ranks x backward_passes_per_step.");
  d.field("eval_batch_size", &D::eval_batch_size, 1000, Range{1, 1 << 20},
          "Evaluation batch (sharded across ranks).");
  d.field("max_train_samples", &D::max_train_samples, 0, Range{0, INT64_MAX},
          "Only the first N (image_folder: the classes' files in turn, every class its share); 0: all.");
  d.field("max_test_samples", &D::max_test_samples, 0, Range{0, INT64_MAX},
          "Only the first N (image_folder: the classes' files in turn, every class its share); 0: all.");
  d.field("shuffle", &D::shuffle, true, Any{},
          "A permutation per epoch from (seed, epoch); false: file order.");
  d.field("drop_last", &D::drop_last, false, Any{}, "Drop the tail that does not fill a global batch.");
  d.field("mean", &D::mean, Json(0.1307), per_channel(false),
          "Pixels become (x/255 - mean[c]) / std[c] in channel c; one number: every channel. Not applied "
          "to generated data.");
  d.field("std", &D::std, Json(0.3081), per_channel(true), "See `data.mean`.");
  d.field("workers", &D::workers, -1, Range{-1, 64},
          "Threads per rank that read, decode, augment and normalise batches ahead of the step. -1: none "
          "for data in memory (1 on a GPU, whose rank's thread is busy queueing kernels), 1 for mapped files "
          "(idx, npy, cifar), and for image_folder one per CPU of the rank (as `threads: 0` counts them: "
          "the host's cores / ranks on it, within the CPUs the rank is bound to; at most 4); the summary "
          "prints the choice.");
  d.field("prefetch", &D::prefetch, 2, Range{1, 64},
          "Batches read ahead of the step; memory per rank is (prefetch + 1) batches, whatever the data "
          "set's size.");
  d.field("resize", &D::resize, 0, Range{0, 16384},
          "image_folder: resize the shorter side to this (bilinear), then centre-crop to model.input_shape; "
          "0: images are centre-cropped as stored.",
          kImageFolderData);
  d.field("on_bad_sample", &D::on_bad_sample, OnBadSample::kError, kOnBadSample,
          "A corrupt or truncated image: `error` stops the run naming the file; `skip` replaces it by the "
          "next good sample (so every rank keeps its step count) and warns with a count after the epoch.");
  auto a = d.section("augment", &D::augment,
                     "Training samples only, keyed by (seed, epoch, sample): the same on any worker, rank "
                     "or resume.");
  a.field("random_crop_padding", &AugmentConfig::random_crop_padding, 0, Range{0, 1024},
          "Pad by this many black pixels, then crop back to H x W at a random offset (RandomCrop); 0: off.");
  a.field("horizontal_flip", &AugmentConfig::horizontal_flip, false, Any{},
          "Mirror left-right with probability 1/2 (RandomHorizontalFlip).");
  auto l = d.section("linear", &D::linear, "Features x_j ~ N(j, 1), target x . coefficients + noise.",
                     kLinearData);
  l.field("samples", &LinearDataConfig::samples, 1000, Range{1, 1 << 30}, "Training samples.");
  l.field("test_samples", &LinearDataConfig::test_samples, 200, Range{1, 1 << 30}, "Test samples.");
  l.field("coefficients", &LinearDataConfig::coefficients, std::vector<double>{5, 3, 2, 1}, kNonEmptyList,
          "The true weights; one feature each.");
  l.field("noise", &LinearDataConfig::noise, 0.0, Range{0.0, 1e6},
          "Standard deviation of the target's noise.");
  auto y = d.section("synthetic", &D::synthetic,
                     "Horovod's benchmark data: seeded N(0, 1) images of model.input_shape, uniform labels.",
                     kSyntheticData);
  y.field("samples", &SyntheticDataConfig::samples, 1024, Range{1, 1 << 30}, "Training samples.");
  y.field("test_samples", &SyntheticDataConfig::test_samples, 256, Range{1, 1 << 30}, "Test samples.");
}

void declare_model(SectionBuilder<Config, ModelConfig> m) {
  using M = ModelConfig;
  m.required(": a model needs input_shape and layers");
  m.field("input_shape", &M::input_shape, Required{}, kShape,
          "Per-sample shape, e.g. `[1, 28, 28]`; for an architecture `[C, H, W]`.");
  m.field(
      "architecture", &M::architecture, "", kArchitectureName,
      "Instead of `layers`: `resnet18`, `resnet34`, `resnet50` (torchvision's) or `resnet20` (He et al.).",
      kArchitectureShown);
  m.field("layers", &M::layers, Required{R"((or name a model.architecture, e.g. "resnet20"))"}, Any{},
          "List of layers: docs/running.md#models-layers-and-architectures.", kLayerList);
  m.field("num_classes", &M::num_classes, 10, Range{1, 1 << 24}, "Outputs of the architecture.",
          kNamedArchitecture);
  m.field("loss", &M::loss, LossKind::kCrossEntropy, kLosses,
          "`cross_entropy` (logits, integer labels) or `mse`.");
  m.field("init_from", &M::init_from, "", Any{},
          "Safetensors file of the parameters by name (e.g. from PyTorch) or a checkpoint; \"\": none.");
}

void declare_optimizer(SectionBuilder<Config, OptimizerConfig> o) {
  using O = OptimizerConfig;
  o.field("type", &O::type, "adam", Choices{optim::optimizer_names}, "The update rule.");
  o.field("lr", &O::lr, kLr, Range{0.0, 1e6}, "Base learning rate for one rank (see lr_scaling).");
  o.field("momentum", &O::momentum, 0.0, Range{0.0, 1.0}, "SGD momentum.", kSgdOnly);
  o.field("dampening", &O::dampening, 0.0, Range{0.0, 1.0}, "SGD dampening.", kSgdOnly);
  o.field("nesterov", &O::nesterov, false, Any{}, "Nesterov momentum; needs momentum > 0, dampening 0.",
          kSgdOnly);
  o.field("weight_decay", &O::weight_decay, kWeightDecay, Range{0.0, 1e3},
          "L2 on the gradient; decoupled for adamw.");
  o.field("betas", &O::betas, std::vector<double>{0.9, 0.999}, kBetas, "Adam's decay rates.", kAdamFamily);
  o.field("eps", &O::eps, 1e-8, Range{0.0, 1.0}, "Adam's denominator term.", kAdamFamily);
  o.field("lr_scaling", &O::lr_scaling, optim::LrScaling::kLinear, kLrScalings,
          "`linear`: lr x ranks x backward_passes_per_step (Goyal et al.).");
  o.field("warmup_epochs", &O::warmup_epochs, 0.0, Range{0.0, 1e6},
          "Per batch from the scaled lr / ranks (Horovod's start: lr x backward passes with linear scaling) "
          "to the scaled lr over these (fractional) epochs.");
  o.field("schedule", &O::schedule, optim::Decay::kConstant, kSchedules,
          "After warmup: `step` (x gamma every step_size_epochs), `cosine` (to min_lr at the end).");
  o.field("step_size_epochs", &O::step_size_epochs, 1.0, Range{1e-6, 1e6}, "Epochs per decay.",
          kStepSchedule);
  o.field("gamma", &O::gamma, 0.1, Range{0.0, 1.0}, "Factor of each decay.", kStepSchedule);
  o.field("min_lr", &O::min_lr, 0.0, Range{0.0, 1e6}, "Learning rate at the last epoch.", kCosineSchedule);
  o.field(
      "max_grad_norm", &O::max_grad_norm, 0.0, Range{0.0, 1e9},
      "0: off. Else the averaged gradients' global L2 norm is clipped to this (PyTorch's clip_grad_norm_).");
}

void declare_training(SectionBuilder<Config, TrainingConfig> t) {
  using T = TrainingConfig;
  t.field("epochs", &T::epochs, 1, Range{1, 1 << 20}, "Epochs to train.");
  t.field("max_steps", &T::max_steps, 0, Range{0, INT64_MAX},
          "Stop after this many optimizer steps; 0: no limit.");
  t.field("progress", &T::progress, ProgressMode::kAuto, kProgressModes,
          "`auto`: a bar on a terminal, lines in logs; `lines` has no carriage returns.");
  t.field("log_every_steps", &T::log_every_steps, 100, Range{1, INT64_MAX},
          "Interval of the plain-line progress.");
}

void declare_distributed(SectionBuilder<Config, DistributedConfig> d) {
  using D = DistributedConfig;
  d.field("backend", &D::backend, CommBackend::kAuto, kCommBackends,
          "`nccl` (GPUs), `mpi` (CPUs; GPUs through host memory); `auto` picks.");
  d.field("fusion_threshold_mb", &D::fusion_threshold_mb, 4.0, Range{0.0, 1e5},
          "Gradient bucket size; 0: an allreduce per tensor.");
  d.field("first_bucket_mb", &D::first_bucket_mb, 1.0, Range{0.0, 1e5},
          "The first bucket (last layers), small so that communication starts early.");
  d.field("overlap", &D::overlap, true, Any{}, "Start each bucket's allreduce during backward.");
  d.field("compression", &D::compression, "none", Choices{distributed::compression_names},
          "`fp16`, `bf16`: a half-precision sum; `fp64`: a double-precision sum, independent of MPI's "
          "order where an element's terms lie within 2^(29 - log2 N) of each other (CPU); `powersgd`: "
          "low-rank factors with error feedback (CPU).");
  d.field("gradient_sync", &D::gradient_sync, "auto", Choices{gradient_sync_choices},
          "How gradients are averaged: `auto` runs `exact_sum` in deterministic mode, the strategy "
          "`compression` names (`powersgd`), else `allreduce` in the compression's wire encoding.");
  d.field("backward_passes_per_step", &D::backward_passes_per_step, 1, Range{1, 1 << 16},
          "Accumulate k batches locally, then reduce once.");
  d.field("check_finite", &D::check_finite, true, Any{},
          "Stop naming step, bucket, parameter on an Inf/NaN average.");
  d.field("shard_optimizer", &D::shard_optimizer, false, Any{},
          "ZeRO-1: reduce-scatter the gradients, update 1/N of the parameters with 1/N of the optimizer "
          "state on each rank, all-gather the parameters. Checkpoints stay whole.");
  d.field("sync_batchnorm", &D::sync_batchnorm, false, Any{},
          "BatchNorm statistics over every rank's batch.");
  d.field("broadcast_buffers", &D::broadcast_buffers, true, Any{},
          "Without SyncBN: rank 0's BatchNorm buffers to every rank before each step (DDP's default).");
  d.field("shared_memory", &D::shared_memory, true, Any{},
          "When every rank runs on one host, gradients are reduced in one shared-memory segment, "
          "without copies (CPU); false, or ranks on several hosts: through MPI.");
  d.field("deterministic", &D::deterministic, false, Any{},
          "The same bits on any number of ranks and threads.");
  d.field("deterministic_micro_batch", &D::deterministic_micro_batch, 32, Range{1, 1 << 30},
          "Samples per micro-batch; divides data.batch_size.", kDeterministic);
  auto p = d.section("powersgd", &D::powersgd, "PowerSGD's settings.", kPowerSgd);
  p.field("rank", &D::PowerSgd::rank, 2, Range{1, 1 << 20}, "Rank of each gradient matrix's approximation.");
  p.field("start_step", &D::PowerSgd::start_step, 100, Range{0, INT64_MAX},
          "Plain allreduce before this global step (PyTorch's start_powerSGD_iter).");
  p.field("min_compression_rate", &D::PowerSgd::min_compression_rate, 2.0, Range{0.0, 1e9},
          "Compress a tensor only if its factors are this many times smaller.");
  d.field("stall_warning_s", &D::stall_warning_s, 60.0, Range{0.0, 1e9},
          "Warn about a collective this late; 0: off.");
  d.field("stall_abort_s", &D::stall_abort_s, kStallAbortAuto, kStallAbort,
          "Abort on a collective this late; 0: never; -1: 600 s under NCCL (PyTorch's timeout), never "
          "under MPI.");
  d.field("timeline", &D::timeline, "", Any{},
          "Chrome-trace JSON of every rank, written by rank 0; \"\": off.");
}

void declare_checkpoint(SectionBuilder<Config, CheckpointConfig> k) {
  using K = CheckpointConfig;
  k.field("dir", &K::dir, kCheckpointDir, kNonEmptyText, "Where rank 0 writes checkpoints.");
  k.field("every_epochs", &K::every_epochs, 1, Range{0, INT64_MAX}, "Every N epochs; 0: not by epoch.");
  k.field("every_steps", &K::every_steps, 0, Range{0, INT64_MAX}, "Every N optimizer steps; 0: not by step.");
  k.field("keep", &K::keep, 3, Range{0, INT64_MAX},
          "Newest N kept; 0: all. One is always written at the end.");
  k.field("on_error", &K::on_error, OnCheckpointError::kStop, kOnCheckpointErrors,
          "A failed write: `stop` the job with a failure status, or `warn` and retry at the next one.");
}

const Section<Config>& table() {
  static const Table<Config> table = [] {
    Table<Config> t("The config object's own keys.");
    Top top = t.root();
    declare_top(top);
    declare_data(top.section("data", &Config::data, "What the run trains and evaluates on."));
    declare_model(top.section("model", &Config::model, "The network and its loss."));
    declare_optimizer(
        top.section("optimizer", &Config::optimizer, "Update rule and learning-rate schedule."));
    declare_training(
        top.section("training", &Config::training, "Length of the run and its progress output."));
    declare_distributed(top.section("distributed", &Config::distributed, "Gradient reduction across ranks."));
    declare_checkpoint(top.section("checkpoint", &Config::checkpoint, "Checkpoints for --resume."));
    return t;
  }();
  return table.section();
}

// What "auto" picks.
std::string automatic_gradient_sync(const DistributedConfig& d) {
  if (d.deterministic) return "exact_sum";
  const std::vector<std::string> strategies = distributed::gradient_sync_names();
  return std::ranges::find(strategies, d.compression) != strategies.end() ? d.compression : "allreduce";
}

}  // namespace

std::string gradient_sync_of(const Config& c) {
  const DistributedConfig& d = c.distributed;
  return d.gradient_sync == "auto" ? automatic_gradient_sync(d) : d.gradient_sync;
}

namespace {

// ---- Rules between fields ------------------------------------------------------------------------

// Listed on the reference page; each is a check in validate() below.
const char* const kRulesDoc = R"(
## Rules between keys

- `optimizer.nesterov` needs `optimizer.momentum` > 0 and `optimizer.dampening` 0.
- `distributed.backend` `"nccl"` needs `device` `"cuda"` or `"auto"`.
- `distributed.deterministic`: `distributed.deterministic_micro_batch` divides `data.batch_size`;
  `distributed.compression` is `"none"`; `distributed.sync_batchnorm` is false; `device` is `"cpu"`.
- `distributed.compression` `"powersgd"` runs on `device` `"cpu"` (or `"auto"` landing on the CPU).
- `distributed.gradient_sync`: `"exact_sum"` exactly when `distributed.deterministic`; with a
  `distributed.compression` other than `"none"`, `"auto"` or the strategy it runs with.
- `distributed.shard_optimizer` runs with the gradient syncs `"allreduce"` and `"exact_sum"` (not
  with `distributed.compression` `"powersgd"`, nor `"local"`).
- `optimizer.max_grad_norm` > 0 does not run with both `distributed.deterministic` and
  `distributed.shard_optimizer`.

Checked at start-up, once the data is open (`trainer/run.cpp`; every rank stops with one line
naming the keys to change):

- `model.input_shape` equals the shape of `data.dataset`'s samples.
- `model.loss` is `"mse"` exactly when the dataset is a regression one (`"linear"`), and
  `"cross_entropy"` otherwise.
- A classifier has at least as many outputs as the dataset has classes (`model.num_classes` for a
  named architecture, the last dense layer's `out_features` for a list of layers).
- `image_folder`: the training and test splits have the same class folders.
- With `data.drop_last`, `data.batch_size` x the number of ranks fits in the training samples (at
  least one step per epoch); and there are at least as many training samples as ranks.
)";

void validate_deterministic(const Config& c) {
  const DistributedConfig& d = c.distributed;
  DPTRAIN_CHECK(c.data.batch_size % d.deterministic_micro_batch == 0,
                "config key distributed.deterministic_micro_batch = ", d.deterministic_micro_batch,
                " does not divide data.batch_size = ", c.data.batch_size,
                "; pick a divisor of every per-rank batch you will run with (e.g. ",
                std::gcd(c.data.batch_size, d.deterministic_micro_batch), ")");
  DPTRAIN_CHECK(d.compression == "none",
                "config keys distributed.deterministic and distributed.compression = \"", d.compression,
                "\" exclude each other: a compressed sum rounds differently for each grouping of "
                "ranks; set compression to \"none\"");
  DPTRAIN_CHECK(!d.sync_batchnorm,
                "config keys distributed.deterministic and distributed.sync_batchnorm exclude each "
                "other: BatchNorm statistics would depend on which rank holds which micro-batch");
  DPTRAIN_CHECK(c.device == DeviceKind::kCpu,
                "config key distributed.deterministic runs on device \"cpu\" only, not \"",
                to_string(c.device), "\"");
  // Each rank would sum the squares of its own shard: the norm's rounding, and with it the update's
  // bits, would depend on the number of ranks.
  DPTRAIN_CHECK(c.optimizer.max_grad_norm == 0 || !d.shard_optimizer,
                "config keys optimizer.max_grad_norm, distributed.deterministic and "
                "distributed.shard_optimizer do not run together: a sharded norm is summed per rank, and its "
                "bits would depend on the number of ranks; turn one of them off");
}

void validate(const Config& c) {
  DPTRAIN_CHECK(!c.optimizer.nesterov || (c.optimizer.momentum > 0 && c.optimizer.dampening == 0),
                "config key optimizer.nesterov needs momentum > 0 and dampening 0");
  const DistributedConfig& d = c.distributed;
  DPTRAIN_CHECK(d.backend != CommBackend::kNccl || c.device != DeviceKind::kCpu,
                "config key distributed.backend = \"nccl\" needs device \"cuda\" (or \"auto\"); NCCL reduces "
                "GPU buffers");
  if (d.deterministic) validate_deterministic(c);
  const std::string sync = gradient_sync_of(c);
  DPTRAIN_CHECK((sync == "exact_sum") == d.deterministic, "config key distributed.gradient_sync = \"",
                d.gradient_sync, "\" ",
                d.deterministic ? "does not run distributed.deterministic, which needs \"exact_sum\""
                                : "(the exact sum) needs distributed.deterministic = true",
                "; use \"auto\"");
  DPTRAIN_CHECK(d.compression == "none" || sync == automatic_gradient_sync(d),
                "config key distributed.compression = \"", d.compression,
                "\" runs with distributed.gradient_sync \"", automatic_gradient_sync(d),
                "\" (or \"auto\"), not \"", d.gradient_sync, "\"");
  const std::vector<std::string> sharding = distributed::sharding_gradient_sync_names();
  DPTRAIN_CHECK(!d.shard_optimizer || std::ranges::find(sharding, sync) != sharding.end(),
                "config key distributed.shard_optimizer runs with distributed.gradient_sync ",
                quoted_alternatives(sharding), ", not \"", sync, "\"",
                d.compression == "powersgd" ? " (distributed.compression = \"powersgd\")" : "",
                "; set one of the two keys otherwise");
  // "auto" may still land on the CPU; PowerSgdReducer refuses GPU buffers if it does not.
  DPTRAIN_CHECK(
      sync != "powersgd" || c.device != DeviceKind::kCuda,
      "config key distributed.compression = \"powersgd\" runs on device \"cpu\" only in this version, not \"",
      to_string(c.device), "\"; use \"fp16\" or \"bf16\" on GPUs");
}

const char* const kReferencePreamble = R"(# Config reference

<!-- Generated from the field tables in trainer/config.cpp; do not edit. Regenerate with
     build/trainer --print-config-reference > docs/config.md
     and the fuzz dictionary's generated block with
     sed -i '/^# BEGIN generated/,$d' tests/fuzz/config.dict &&
       build/trainer --print-config-reference=dict >> tests/fuzz/config.dict
     (trainer_tests' ConfigReference tests fail while either is stale). -->

A config is one JSON object (comments allowed). `--set key.path=VALUE` sets any key below from the
command line; `--print-config` prints the resolved config, every default filled in. Unknown keys,
wrong types and values outside "Allowed" are errors naming the key.

"Applies when": a key given where its condition fails is an error, unless marked "ignored
otherwise": such a key is still checked against its range, then ignored. Either way the resolved
config leaves it out there.
)";

}  // namespace

std::string to_string(DeviceKind kind) {
  return name_of(kind, kDevices);
}
std::string to_string(CommBackend kind) {
  return name_of(kind, kCommBackends);
}
std::string to_string(LossKind kind) {
  return name_of(kind, kLosses);
}

Json read_json_file(const std::string& path) {
  std::error_code ignored;
  DPTRAIN_CHECK(!std::filesystem::is_directory(path, ignored), path,
                ": is a directory; --config takes a JSON file (configs/ has examples)");
  std::ifstream in(path);
  DPTRAIN_CHECK(
      in, path, ": cannot open config file: ", std::strerror(errno),
      std::filesystem::path(path).is_relative()
          ? " (relative to the current directory, " + std::filesystem::current_path(ignored).string() + ")"
          : "");
  try {
    return Json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number such as 1e400
    DPTRAIN_FAIL(path, ": not valid JSON: ", e.what());
  }
}

std::string config_source(const std::string& path, const std::vector<std::string>& assignments) {
  std::string source = path;
  for (const std::string& assignment : assignments) source += " --set " + assignment;
  return source;
}

Json read_config(const std::string& path, const std::vector<std::string>& assignments) {
  Json json = read_json_file(path);
  for (const std::string& assignment : assignments) apply_override(json, assignment);
  parse_config(json);
  return json;
}

void apply_override(Json& config, const std::string& assignment) {
  const auto eq = assignment.find('=');
  DPTRAIN_CHECK(eq != std::string::npos && eq > 0, "bad --set '", assignment, "': expected key.path=VALUE");
  try {
    static_cast<void>(Json(assignment).dump());  // the config travels to the other ranks as JSON text
  } catch (const Json::type_error&) {
    DPTRAIN_FAIL("bad --set: '", Json(assignment).dump(-1, ' ', false, Json::error_handler_t::replace),
                 "' is not valid UTF-8");
  }
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  Json value;
  try {
    value = Json::parse(text);
  } catch (const Json::out_of_range&) {  // a number beyond double's range, e.g. 1e400
    DPTRAIN_FAIL("bad --set '", assignment, "': ", text, " is out of range for a number");
  } catch (const Json::parse_error&) {
    const bool bare_word = !text.empty() && text.find_first_of("{}[]\",: ") == std::string::npos;
    DPTRAIN_CHECK(bare_word, "bad --set '", assignment, "': value is not JSON (quote strings, e.g. ", path,
                  "='\"text\"')");
    value = text;
  }
  Json* node = &config;
  std::stringstream keys(path);
  std::string key, walked;
  while (std::getline(keys, key, '.')) {
    DPTRAIN_CHECK(!key.empty(), "bad --set '", assignment, "': empty key in path");
    DPTRAIN_CHECK(key.find('[') == std::string::npos, "bad --set '", assignment,
                  "': --set cannot index into a list; give ", "the whole list, e.g. --set '",
                  walked.empty() ? "" : walked + ".", key.substr(0, key.find('[')), "=[...]'");
    if (node->is_null()) *node = Json::object();  // a section the file leaves out
    DPTRAIN_CHECK(node->is_object(), "bad --set '", assignment, "': ", walked, " is not an object");
    walked += (walked.empty() ? "" : ".") + key;
    node = &(*node)[key];
  }
  *node = std::move(value);
}

Config parse_config(const Json& json) {
  Config c{};
  read_section(table(), json, c);
  validate(c);
  return c;
}

Json to_json(const Config& c) {
  return write_section(table(), c);
}

std::string config_reference_markdown() {
  std::vector<SectionDoc> sections;
  describe(table(), sections);
  return render_reference(sections, kReferencePreamble) + kRulesDoc;
}

std::string config_fuzz_dictionary() {
  std::vector<SectionDoc> sections;
  describe(table(), sections);
  return "# BEGIN generated from the config table: trainer --print-config-reference=dict\n" +
         render_fuzz_dictionary(sections) + "# END generated\n";
}

}  // namespace dptrain::trainer
