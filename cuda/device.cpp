// Device probing and the choice of a rank's GPU.
#include "cuda/device.h"

#include <cuda_runtime.h>

#include <cstdlib>

#include "core/error.h"

namespace dptrain::cuda {

DeviceProbe probe_devices() {
  DeviceProbe probe;
  const cudaError_t status = cudaGetDeviceCount(&probe.count);
  if (status != cudaSuccess) {
    probe.count = 0;
    probe.reason = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    cudaGetLastError();  // clear it so that later calls start clean
  } else if (probe.count == 0) {
    probe.reason = "the CUDA driver reports no device";
  }
  return probe;
}

int choose_device(int local_rank, int local_size, bool share) {
  const DeviceProbe probe = probe_devices();
  DPTRAIN_CHECK(probe.count > 0, "device \"cuda\": no usable GPU (", probe.reason,
                "); run on a GPU machine or set device to \"cpu\"");
  // A launcher that gives every rank a GPU of its own (Slurm's --gpus-per-task=1) shows each rank
  // one device through CUDA_VISIBLE_DEVICES: that one is this rank's.
  if (probe.count == 1 && std::getenv("CUDA_VISIBLE_DEVICES") != nullptr) return 0;
  DPTRAIN_CHECK(share || local_size <= probe.count, "device \"cuda\": ", local_size,
                " ranks on this host but ", probe.count,
                " GPU(s); NCCL needs a GPU per rank: start at most that many ranks per host, or set "
                "distributed.backend to \"mpi\" to let ranks share GPUs");
  return local_rank % probe.count;
}

}  // namespace dptrain::cuda
