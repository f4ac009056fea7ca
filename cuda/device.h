// GPUs on this host: probing (never throws: no driver and no device are answers, not errors) and
// the choice of one GPU per rank. No CUDA type in this header.
#pragma once

#include <string>

namespace dptrain::cuda {

struct DeviceProbe {
  int count = 0;
  std::string reason;  // why count is 0 ("no CUDA driver", ...); empty otherwise
};
DeviceProbe probe_devices();

// The GPU of the rank with `local_rank` among `local_size` ranks on this host: its local rank. More
// ranks than GPUs is an error naming both counts, unless `share` (several ranks per GPU, for the
// MPI fallback of distributed.backend "mpi"): then local_rank modulo the count; or unless each
// rank sees a GPU of its own (CUDA_VISIBLE_DEVICES set, one device visible). Throws, with the
// driver's reason, when there is no GPU.
int choose_device(int local_rank, int local_size, bool share);

}  // namespace dptrain::cuda
