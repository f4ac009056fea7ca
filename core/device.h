// Device: where a tensor's memory lives and whose kernels run on it ("cpu", "reference", "cuda:N").
#pragma once

#include <compare>
#include <cstdint>
#include <string>

namespace dptrain {

enum class DeviceType : uint8_t {
  kCpu,        // host memory, the optimised kernels (Eigen)
  kReference,  // host memory, naive kernels in double: the oracle other backends are tested against
  kCuda,       // GPU memory, the CUDA backend (cuda/), when built and registered
};

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // which GPU; 0 for the host devices

  static constexpr Device cpu() { return {DeviceType::kCpu, 0}; }
  static constexpr Device reference() { return {DeviceType::kReference, 0}; }
  static constexpr Device cuda(int index) { return {DeviceType::kCuda, index}; }

  // Memory the CPU may read and write directly.
  constexpr bool is_host() const { return type != DeviceType::kCuda; }
  std::string str() const;  // "cpu", "reference", "cuda:0"

  friend constexpr bool operator==(const Device&, const Device&) = default;
};

}  // namespace dptrain
