// Device names (core/backends.cpp is the registry of backends, core/backend_defaults.cpp the backend
// table's default fused kernels).
#include "core/device.h"

namespace dptrain {

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kReference:
      return "reference";
    case DeviceType::kCuda:
      return "cuda:" + std::to_string(index);
  }
  return "?";
}

}  // namespace dptrain
