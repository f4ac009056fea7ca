// The run configuration: JSON file (+ --set overrides) -> typed, validated structs. Unknown keys,
// wrong types and out-of-range values are errors naming the key path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config_reader.h"
#include "core/tensor.h"
#include "distributed/reducer.h"
#include "optim/schedule.h"
#include "trainer/progress.h"

namespace dptrain::trainer {

struct LinearDataConfig {
  int64_t samples = 1000;
  int64_t test_samples = 200;
  std::vector<double> coefficients = {5, 3, 2, 1};
  double noise = 0;
};

enum class DeviceKind { kCpu, kCuda, kAuto };   // kAuto: CUDA when this build has it and a GPU is there
enum class CommBackend { kAuto, kNccl, kMpi };  // kAuto: NCCL on GPUs, MPI on CPUs
enum class DatasetKind { kMnist, kFashionMnist, kLinear, kSynthetic };
enum class LossKind { kCrossEntropy, kMse };
enum class OptimizerKind { kSgd, kAdam, kAdamW };
enum class OnCheckpointError { kStop, kWarn };  // what a failed checkpoint write does to the run

// The config spellings ("fashion_mnist", "mse", "adamw", ...).
std::string to_string(DeviceKind kind);
std::string to_string(CommBackend kind);
std::string to_string(DatasetKind kind);
std::string to_string(LossKind kind);
std::string to_string(OptimizerKind kind);

// Horovod's synthetic benchmark data: seeded N(0, 1) images of model.input_shape, uniform labels.
struct SyntheticDataConfig {
  int64_t samples = 1024;
  int64_t test_samples = 256;
};

struct DataConfig {
  DatasetKind dataset = DatasetKind::kMnist;
  std::string dir;           // default: data/mnist or /usr/share/datasets/fashion-mnist
  int64_t batch_size = 128;  // per rank
  int64_t eval_batch_size = 1000;
  int64_t max_train_samples = 0;  // 0: all; else the first N (short test and benchmark runs)
  int64_t max_test_samples = 0;
  bool shuffle = true;
  bool drop_last = false;
  double mean = 0.1307;
  double std = 0.3081;
  LinearDataConfig linear;        // data.dataset "linear" only
  SyntheticDataConfig synthetic;  // data.dataset "synthetic" only
};

struct ModelConfig {
  Shape input_shape;
  std::string architecture;  // "resnet18" | "resnet34" | "resnet50" | "resnet20"; or else `layers`
  int64_t num_classes = 10;  // architectures only
  Json layers;
  LossKind loss = LossKind::kCrossEntropy;
  std::string init_from;
};

struct OptimizerConfig {
  OptimizerKind type = OptimizerKind::kAdam;
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  optim::LrScaling lr_scaling = optim::LrScaling::kLinear;  // x world size x backward passes per step
  double warmup_epochs = 0;
  optim::Decay schedule = optim::Decay::kConstant;
  double step_size_epochs = 1;
  double gamma = 0.1;
  double min_lr = 0;
};

struct CudaConfig {
  bool tf32 = false;           // TF32 tensor cores for fp32 GEMMs and convolutions
  bool deterministic = false;  // only cuDNN algorithms with run-to-run identical results
};

struct DistributedConfig {
  CommBackend backend = CommBackend::kAuto;
  double fusion_threshold_mb = 4;
  double first_bucket_mb = 1;
  bool overlap = true;
  distributed::Compression compression = distributed::Compression::kNone;
  int64_t backward_passes_per_step = 1;
  bool check_finite = true;
  bool sync_batchnorm = false;    // BatchNorm statistics over every rank's batch (SyncBatchNorm)
  bool broadcast_buffers = true;  // rank 0's BatchNorm buffers to every rank before each step (DDP's default)
  // The same bits on any number of ranks and threads: fixed micro-batches in the sampler's global order,
  // gradients summed in fixed point (distributed/exact_sum.h).
  bool deterministic = false;
  int64_t deterministic_micro_batch = 32;  // samples; divides data.batch_size
  // compression "powersgd": low-rank factors with error feedback (distributed/powersgd.h).
  struct PowerSgd {
    int64_t rank = 2;
    int64_t start_step = 100;  // plain allreduce before this global step (PyTorch's start_powerSGD_iter)
    double min_compression_rate = 2;
  } powersgd;
  double stall_warning_s = 60;
  double stall_abort_s = 0;  // 0: never
  std::string timeline;      // Chrome-trace JSON written here (by rank 0, all ranks' tracks); "" = off
};

struct TrainingConfig {
  int64_t epochs = 1;
  int64_t max_steps = 0;                        // 0: no limit
  ProgressMode progress = ProgressMode::kAuto;  // "auto" | "bar" | "lines" | "off"
  int64_t log_every_steps = 100;                // interval of the plain-line progress
};

struct CheckpointConfig {
  std::string dir;           // default: <output_dir>/checkpoints
  int64_t every_epochs = 1;  // 0: not at epoch ends (one is still written when training ends)
  int64_t every_steps = 0;   // 0: not by step count
  int64_t keep = 3;          // newest K kept; 0: all
  // "stop": the job stops with a failure status; "warn": training goes on, the next checkpoint
  // tries again.
  OnCheckpointError on_error = OnCheckpointError::kStop;
};

struct Config {
  uint64_t seed = 0;
  std::string output_dir = "runs/default";
  int threads = 0;  // 0: all cores
  DeviceKind device = DeviceKind::kCpu;
  CudaConfig cuda;
  DataConfig data;
  ModelConfig model;
  OptimizerConfig optimizer;
  TrainingConfig training;
  DistributedConfig distributed;
  CheckpointConfig checkpoint;
};

// Reads a JSON file; a missing file or a syntax error names the file (and the line).
Json read_json_file(const std::string& path);
// Applies "key.path=VALUE": VALUE is parsed as JSON, or taken as a string when it is a bare word
// (so --set data.dataset=fashion_mnist works without shell-escaped quotes).
void apply_override(Json& config, const std::string& assignment);
Config parse_config(const Json& config);
// The fully resolved config, every default filled in (what --print-config shows and runs record).
Json to_json(const Config& config);

}  // namespace dptrain::trainer
