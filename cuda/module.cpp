// The entry point of libdptrain_cuda.so: the table trainer/devices.cpp looks up after opening it.
#include "cuda/module.h"

extern "C" __attribute__((visibility("default"))) const dptrain::cuda::ModuleEntryPoints*
dptrain_cuda_module_entry_points() {
  using namespace dptrain::cuda;
  static constexpr ModuleEntryPoints kEntryPoints{kModuleInterfaceVersion, &probe_devices, &use_gpu,
                                                  &make_nccl_communicator};
  return &kEntryPoints;
}
