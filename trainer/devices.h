// The run's device (config key `device`) and the communicator that reduces and broadcasts its
// buffers (`distributed.backend`): the one place where the trainer meets cuda/.
#pragma once

#include <memory>

#include "core/device.h"
#include "distributed/communicator.h"
#include "distributed/world.h"
#include "trainer/config.h"

namespace dptrain::trainer {

// cpu, or this rank's GPU (its backend registered). A missing driver or GPU, too few GPUs for the
// ranks on a host, or a build without CUDA: one clear error.
Device choose_run_device(const Config& config, const distributed::World& world);

// The communicator for buffers on `device`: null on the host (the host communicator serves), NCCL
// on a GPU, or `host` behind a staging copy with distributed.backend "mpi".
std::unique_ptr<distributed::Communicator> make_device_communicator(const Config& config, Device device,
                                                                    distributed::Communicator& host);

}  // namespace dptrain::trainer
