// The run configuration: JSON file (+ --set overrides) -> typed, validated structs. Unknown keys,
// wrong types and out-of-range values are errors naming the key path. The members state no defaults
// ({} only keeps a struct that nobody parsed zeroed): the field table in config.cpp is the one place
// that does, and docs/config.md is generated from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config_reader.h"
#include "core/tensor.h"
#include "data/synthetic.h"
#include "distributed/reducer.h"
#include "optim/schedule.h"
#include "trainer/progress.h"

namespace dptrain::trainer {

using LinearDataConfig = data::LinearDataOptions;

enum class DeviceKind { kCpu, kCuda, kAuto };   // kAuto: CUDA when this build has it and a GPU is there
enum class CommBackend { kAuto, kNccl, kMpi };  // kAuto: NCCL on GPUs, MPI on CPUs
enum class LossKind { kCrossEntropy, kMse };
enum class OnCheckpointError { kStop, kWarn };  // what a failed checkpoint write does to the run
enum class OnBadSample { kError, kSkip };       // what a corrupt image or a bad label does to the run

// The config spellings ("fashion_mnist", "mse", "adamw", ...).
std::string to_string(DeviceKind kind);
std::string to_string(CommBackend kind);
std::string to_string(LossKind kind);

using SyntheticDataConfig = data::SyntheticDataOptions;

struct AugmentConfig {  // training split only
  int64_t random_crop_padding{};
  bool horizontal_flip{};
};

struct DataConfig {
  std::string dataset{};  // a registered format (data/registry.h)
  std::string dir;
  int64_t batch_size{};  // per rank
  int64_t eval_batch_size{};
  int64_t max_train_samples{};  // 0: all; else the first N (short test and benchmark runs)
  int64_t max_test_samples{};
  bool shuffle{};
  bool drop_last{};
  Json mean;  // a number, or one per channel
  Json std;
  int64_t workers{};   // -1: as data::default_workers picks
  int64_t prefetch{};  // batches read ahead
  int64_t resize{};    // image_folder: the shorter side resized to this first; 0: as stored
  OnBadSample on_bad_sample{};
  AugmentConfig augment;
  LinearDataConfig linear;        // data.dataset "linear" only
  SyntheticDataConfig synthetic;  // data.dataset "synthetic" only
};

struct ModelConfig {
  Shape input_shape;
  std::string architecture;  // "resnet18" | "resnet34" | "resnet50" | "resnet20"; or else `layers`
  int64_t num_classes{};     // architectures only
  Json layers;
  LossKind loss{};
  std::string init_from;
};

struct OptimizerConfig {
  std::string type{};  // a registered optimizer (optim/registry.h)
  double lr{};
  double momentum{};
  double dampening{};
  bool nesterov{};
  double weight_decay{};
  std::vector<double> betas;
  double eps{};
  optim::LrScaling lr_scaling{};  // x world size x backward passes per step
  double warmup_epochs{};
  optim::Decay schedule{};
  double step_size_epochs{};
  double gamma{};
  double min_lr{};
  double max_grad_norm{};  // 0: no clipping
};

struct CpuConfig {
  bool winograd{};          // 3x3 stride-1 convolutions by Winograd's minimal filtering where it applies
  int64_t winograd_tile{};  // its tiles' outputs a side in the forward and input gradient: 2 or 4
};

struct CudaConfig {
  bool tf32{};             // TF32 tensor cores for fp32 GEMMs and convolutions
  bool deterministic{};    // only cuDNN algorithms with run-to-run identical results
  bool cudnn_benchmark{};  // algorithms ranked by timing them (cudnnFind) rather than by heuristics
};

// distributed.stall_abort_s's default: decided by the communicator (stall_abort_seconds).
inline constexpr double kStallAbortAuto = -1.0;

struct DistributedConfig {
  CommBackend backend{};

  double fusion_threshold_mb{};
  double first_bucket_mb{};
  bool overlap{};
  std::string compression{};    // a wire encoding or a compressing gradient sync
  std::string gradient_sync{};  // "auto" or a registered strategy (distributed/gradient_sync.h)
  int64_t backward_passes_per_step{};
  bool check_finite{};
  // ZeRO-1: gradients reduce-scattered, each rank updates 1/N of the parameters with the only copy of
  // that part's optimizer state, parameters all-gathered (distributed/shard_layout.h).
  bool shard_optimizer{};
  bool sync_batchnorm{};     // BatchNorm statistics over every rank's batch (SyncBatchNorm)
  bool broadcast_buffers{};  // rank 0's BatchNorm buffers to every rank before each step (DDP's default)
  // Ranks on one host reduce the gradients in shared memory, without copies (MpiCommunicator).
  bool shared_memory{};
  // The same bits on any number of ranks and threads: fixed micro-batches in the sampler's global order,
  // gradients summed in fixed point (distributed/exact_sum.h).
  bool deterministic{};
  int64_t deterministic_micro_batch{};  // samples; divides data.batch_size
  // compression "powersgd": low-rank factors with error feedback (distributed/powersgd.h).
  struct PowerSgd {
    int64_t rank{};
    int64_t start_step{};  // plain allreduce before this global step (PyTorch's start_powerSGD_iter)
    double min_compression_rate{};
  } powersgd;
  double stall_warning_s{};
  double stall_abort_s{};  // 0: never; kStallAbortAuto: by backend (stall_abort_seconds)
  std::string timeline;    // Chrome-trace JSON written here (by rank 0, all ranks' tracks); "" = off
};

// The stall abort in seconds for a communicator: the configured one, or by default 600 s for NCCL
// (a dead peer otherwise hangs its GPU collectives forever; PyTorch's NCCL timeout is 10 minutes)
// and none for MPI (whose collectives cannot be cancelled; the warnings name the wait).
inline double stall_abort_seconds(const DistributedConfig& d, bool nccl) {
  if (d.stall_abort_s != kStallAbortAuto) return d.stall_abort_s;
  return nccl ? 600.0 : 0.0;
}

struct TrainingConfig {
  int64_t epochs{};
  int64_t max_steps{};        // 0: no limit
  ProgressMode progress{};    // "auto" | "bar" | "lines" | "off"
  int64_t log_every_steps{};  // interval of the plain-line progress
};

struct CheckpointConfig {
  std::string dir;
  int64_t every_epochs{};  // 0: not at epoch ends (one is still written when training ends)
  int64_t every_steps{};   // 0: not by step count
  int64_t keep{};          // newest K kept; 0: all
  // "stop": the job stops with a failure status; "warn": training goes on, the next checkpoint
  // tries again.
  OnCheckpointError on_error{};
};

struct Config {
  uint64_t seed{};
  std::string output_dir{};
  int threads{};  // 0: SLURM_CPUS_PER_TASK, else the host's cores / its ranks, within the affinity mask
  DeviceKind device{};
  CpuConfig cpu;
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
// The config file with the --set assignments applied, checked by parse_config. Its errors name the
// key ("config key ..."); main puts config_source before them, as before a layer's.
Json read_config(const std::string& path, const std::vector<std::string>& assignments);
// "<path> --set a=1 --set b=2": where a config's keys came from, as its errors name it.
std::string config_source(const std::string& path, const std::vector<std::string>& assignments);
// The fully resolved config, every default filled in (what --print-config shows and runs record).
Json to_json(const Config& config);
// The gradient-sync strategy a config runs: distributed.gradient_sync, or for "auto" the exact sum in
// deterministic mode, the strategy that distributed.compression names (powersgd), else "allreduce".
std::string gradient_sync_of(const Config& config);
// docs/config.md, generated from the field table (trainer --print-config-reference).
std::string config_reference_markdown();
// The generated block of tests/fuzz/config.dict (trainer --print-config-reference=dict).
std::string config_fuzz_dictionary();

}  // namespace dptrain::trainer
