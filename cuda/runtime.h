// What the trainer asks of cuda/, with no CUDA type in sight: put this rank's GPU behind the backend
// table, and make the NCCL communicator for its gradients.
#pragma once

#include <memory>

#include "core/device.h"
#include "distributed/communicator.h"

namespace dptrain::cuda {

struct GpuOptions {
  bool tf32 = false;             // cuda.tf32
  bool deterministic = false;    // cuda.deterministic
  bool cudnn_benchmark = false;  // cuda.cudnn_benchmark
  bool share = false;            // several ranks may use one GPU (distributed.backend "mpi")
};

// Registers the CUDA backend of this rank's GPU (cuda/device.h: choose_device) and returns its
// device. Throws one clear error when there is no driver, no GPU, or too few GPUs for the ranks.
Device use_gpu(int local_rank, int local_size, const GpuOptions& options);

// The NCCL communicator of `device` (registered by use_gpu), joined through `host`.
std::unique_ptr<distributed::Communicator> make_nccl_communicator(distributed::Communicator& host,
                                                                  Device device,
                                                                  distributed::StallPolicy stall);

}  // namespace dptrain::cuda
