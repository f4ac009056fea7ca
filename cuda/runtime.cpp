// Registering the CUDA backend and making the NCCL communicator.
#include "cuda/runtime.h"

#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/nccl_communicator.h"

namespace dptrain::cuda {

Device use_gpu(int local_rank, int local_size, const GpuOptions& options) {
  const Device device = Device::cuda(choose_device(local_rank, local_size, options.share));
  if (!has_backend(device))
    register_backend(
        std::make_shared<CudaBackend>(device.index, CudaOptions{options.tf32, options.deterministic}));
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
