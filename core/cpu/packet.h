// Eigen's packet of floats for the build's vector ISA (16 lanes with AVX-512), and the operations
// the CPU's hand-blocked kernels use on it.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <vector>

namespace dptrain::cpu::simd {

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int64_t kLanes = Eigen::internal::packet_traits<float>::size;
// Vector registers that register-blocked kernels size their accumulators by: 32 with AVX-512, 16 with
// AVX2. A block that needs more spills to the stack on every multiply-add.
constexpr int kVectorRegisters = kLanes >= 16 ? 32 : 16;
using Eigen::internal::padd;
using Eigen::internal::pmadd;  // fused where the ISA has a fused multiply-add
using Eigen::internal::pset1;
using Eigen::internal::pstoreu;

// kLanes packets, which Eigen's ptranspose transposes in registers (row i becomes column i).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // Packet's vector attributes, as a template argument
using Block = Eigen::internal::PacketBlock<Packet, kLanes>;
#pragma GCC diagnostic pop

inline Packet load(const float* p) {
  return Eigen::internal::ploadu<Packet>(p);
}
inline Packet zero() {
  return pset1<Packet>(0.0f);
}
// Floats on a 64-byte boundary, so that packets at multiples of kLanes never split a cache line.
using AlignedFloats = std::vector<float, Eigen::aligned_allocator<float>>;

// At least `floats` floats of the calling thread, one buffer per distinct Slot (an enumerator of the
// caller's), kept from call to call: kernels run every step, and fresh buffers of their size come from
// mmap and fault every page in again each time.
template <auto Slot>
float* thread_scratch(int64_t floats) {
  thread_local AlignedFloats buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(static_cast<std::size_t>(floats));
  return buffer.data();
}

}  // namespace dptrain::cpu::simd
