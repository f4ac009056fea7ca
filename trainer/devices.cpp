// Device choice and the device communicator; CUDA only where the build has it, through its module.
#include "trainer/devices.h"

#include "core/error.h"
#include "distributed/staged_communicator.h"
#if defined(DPTRAIN_WITH_CUDA)
#include <dlfcn.h>

#include <string>

#include "cuda/module.h"
#endif

namespace dptrain::trainer {

#if defined(DPTRAIN_WITH_CUDA)
namespace {

struct CudaModule {
  const cuda::ModuleEntryPoints* entry_points = nullptr;  // null when it could not be opened
  std::string error;                                      // why, then
};

// Opened on first use and never closed: the backend it registers lives as long as the process.
// RTLD_NOW: a symbol the module needs and the program lacks is an error here, not at its first call.
const CudaModule& cuda_module() {
  static const CudaModule module = [] {
    CudaModule opened;
    void* handle = dlopen(cuda::kModuleFile, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      opened.error = dlerror();
      return opened;
    }
    auto* entry = reinterpret_cast<decltype(&dptrain_cuda_module_entry_points)>(
        dlsym(handle, cuda::kModuleEntrySymbol));
    if (entry == nullptr) {
      opened.error = dlerror();
      return opened;
    }
    const cuda::ModuleEntryPoints* entry_points = entry();
    if (entry_points->interface_version != cuda::kModuleInterfaceVersion) {
      opened.error = detail::concat("it was built from other sources (interface version ",
                                    entry_points->interface_version, ", the trainer's ",
                                    cuda::kModuleInterfaceVersion, ")");
      return opened;
    }
    opened.entry_points = entry_points;
    return opened;
  }();
  return module;
}

const cuda::ModuleEntryPoints& require_cuda_module() {
  const CudaModule& module = cuda_module();
  DPTRAIN_CHECK(module.entry_points != nullptr, "device \"cuda\": cannot load the CUDA backend ",
                cuda::kModuleFile, " (", module.error,
                "); it is built beside the trainer, in the build's lib/, and needs the CUDA runtime, cuBLAS, "
                "cuDNN and NCCL it was built with (ldconfig or LD_LIBRARY_PATH); or set device to \"cpu\"");
  return *module.entry_points;
}

}  // namespace
#endif

Device choose_run_device(const Config& config, const distributed::World& world) {
  if (config.device == DeviceKind::kCpu) return Device::cpu();
#if defined(DPTRAIN_WITH_CUDA)
  // "auto" takes a machine without CUDA's libraries, like one without a GPU, as a CPU machine.
  if (config.device == DeviceKind::kAuto &&
      (cuda_module().entry_points == nullptr || cuda_module().entry_points->probe_devices().count == 0))
    return Device::cpu();
  return require_cuda_module().use_gpu(world.local_rank(), world.local_size(),
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
  return require_cuda_module().make_nccl_communicator(
      host, device,
      {.warning_s = config.distributed.stall_warning_s,
       .abort_s = stall_abort_seconds(config.distributed, /*nccl=*/true)});
#else
  DPTRAIN_FAIL("no communicator for ", device.str(), " in this build");
#endif
}

}  // namespace dptrain::trainer
