// Device choice and the device communicator; CUDA only where the build has it.
#include "trainer/devices.h"

#include "core/error.h"
#include "distributed/staged_communicator.h"
#if defined(DPTRAIN_WITH_CUDA)
#include "cuda/device.h"
#include "cuda/runtime.h"
#endif

namespace dptrain::trainer {

Device choose_run_device(const Config& config, const distributed::World& world) {
  if (config.device == DeviceKind::kCpu) return Device::cpu();
#if defined(DPTRAIN_WITH_CUDA)
  if (config.device == DeviceKind::kAuto && cuda::probe_devices().count == 0) return Device::cpu();
  return cuda::use_gpu(world.local_rank(), world.local_size(),
                       {.tf32 = config.cuda.tf32,
                        .deterministic = config.cuda.deterministic,
                        .cudnn_benchmark = config.cuda.cudnn_benchmark,
                        .share = config.distributed.backend == CommBackend::kMpi});
#else
  (void)world;
  DPTRAIN_CHECK(
      config.device == DeviceKind::kAuto,
      "device \"cuda\": this build has no CUDA backend; build with -DDPTRAIN_CUDA=ON where the CUDA "
      "toolkit, cuDNN and NCCL are installed, or set device to \"cpu\"");
  return Device::cpu();
#endif
}

std::unique_ptr<distributed::Communicator> make_device_communicator(const Config& config, Device device,
                                                                    distributed::Communicator& host) {
  if (device.is_host()) return nullptr;
  if (config.distributed.backend == CommBackend::kMpi)
    return std::make_unique<distributed::StagedCommunicator>(host, device);
#if defined(DPTRAIN_WITH_CUDA)
  return cuda::make_nccl_communicator(host, device,
                                      {.warning_s = config.distributed.stall_warning_s,
                                       .abort_s = stall_abort_seconds(config.distributed, /*nccl=*/true)});
#else
  DPTRAIN_FAIL("no communicator for ", device.str(), " in this build");
#endif
}

}  // namespace dptrain::trainer
