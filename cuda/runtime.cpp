// Registering the CUDA backend and making the NCCL communicator.
#include "cuda/runtime.h"

#include <cstdlib>

#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/nccl_communicator.h"

namespace dptrain::cuda {

// The backends live as long as the process (the registry never lets go: a tensor released during
// static destruction still finds its backend). What they keep is freed by release_backend_caches()
// at the end of main(), or else at exit, before the CUDA runtime's own teardown (registered earlier,
// so run later).
Device use_gpu(int local_rank, int local_size, const GpuOptions& options) {
  const Device device = Device::cuda(choose_device(local_rank, local_size, options.share));
  if (!has_backend(device)) {
    register_backend(std::make_shared<CudaBackend>(
        device.index, CudaOptions{options.tf32, options.deterministic, options.cudnn_benchmark}));
    static const bool release_at_exit = std::atexit(release_backend_caches) == 0;
    (void)release_at_exit;
  }
  return device;
}

std::unique_ptr<distributed::Communicator> make_nccl_communicator(distributed::Communicator& host,
                                                                  Device device,
                                                                  distributed::StallPolicy stall) {
  auto* backend = dynamic_cast<CudaBackend*>(&backend_for(device));
  DPTRAIN_CHECK(backend != nullptr, "make_nccl_communicator: ", device.str(), " has no CUDA backend");
  return std::make_unique<NcclCommunicator>(host, *backend, stall);
}

}  // namespace dptrain::cuda
