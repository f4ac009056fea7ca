// The CUDA backend as the trainer reaches it: a table of entry points in libdptrain_cuda.so, which
// trainer/devices.cpp opens only when the config asks for a GPU. No CUDA type in this header.
#pragma once

#include <memory>

#include "core/device.h"
#include "cuda/device.h"
#include "cuda/runtime.h"
#include "distributed/communicator.h"

namespace dptrain::cuda {

struct ModuleEntryPoints {
  int interface_version;  // kModuleInterfaceVersion of the sources the module was built from
  DeviceProbe (*probe_devices)();
  Device (*use_gpu)(int local_rank, int local_size, const GpuOptions& options);
  std::unique_ptr<distributed::Communicator> (*make_nccl_communicator)(distributed::Communicator& host,
                                                                       Device device,
                                                                       distributed::StallPolicy stall);
};

// Raised with every change to this table or to a type it passes: a module left from other sources
// is refused by name instead of being called with the wrong layout.
inline constexpr int kModuleInterfaceVersion = 1;
// Found through the rpath of the program that opens it (cuda/CMakeLists.txt).
inline constexpr const char* kModuleFile = "libdptrain_cuda.so";
inline constexpr const char* kModuleEntrySymbol = "dptrain_cuda_module_entry_points";

}  // namespace dptrain::cuda

// Defined in the module only (cuda/module.cpp); declared here for its type.
extern "C" const dptrain::cuda::ModuleEntryPoints* dptrain_cuda_module_entry_points();
