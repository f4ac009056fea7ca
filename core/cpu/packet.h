// Eigen's packet of floats for the build's vector ISA (16 lanes with AVX-512), the operations the
// CPU's hand-blocked kernels use on it (a transpose through registers among them), the L2's size,
// their per-thread scratch, and streamed (non-temporal) stores.
#pragma once

#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(__AVX__)
#include <immintrin.h>
#endif

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
// The transpose of a [rows, cols] matrix: to_row(j)[i] = from(i, j) (+= with Add), where
// from.packet(i, j) is row i's floats j to j + kLanes as a packet and from(i, j) one float (Rows below
// for rows in memory). Blocks of kLanes x kLanes go through a transpose in registers, so that every
// load and store is a packet; the edges go float by float. Each element is written (or added to) once:
// the bits are those of a loop over elements. (Float by float, a row of the other side a plane apart
// at each step, the per-tap convolutions' three transposes took about 7 ms of the 74 that ResNet-50's
// 256 channels over 14x14 took a call, one Intel Xeon core.)
template <bool Add, typename From, typename ToRow>
void transpose(int64_t rows, int64_t cols, const From& from, ToRow to_row) {
  const int64_t whole_rows = rows / kLanes * kLanes, whole_cols = cols / kLanes * kLanes;
  for (int64_t i = 0; i < whole_rows; i += kLanes)
    for (int64_t j = 0; j < whole_cols; j += kLanes) {
      Block block;
      for (int64_t t = 0; t < kLanes; ++t) block.packet[t] = from.packet(i + t, j);
      Eigen::internal::ptranspose(block);
      for (int64_t t = 0; t < kLanes; ++t) {
        float* to = to_row(j + t) + i;
        pstoreu(to, Add ? padd(load(to), block.packet[t]) : block.packet[t]);
      }
    }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = i < whole_rows ? whole_cols : 0; j < cols; ++j) {
      float& to = to_row(j)[i];
      to = Add ? to + from(i, j) : from(i, j);
    }
}
// Rows in memory, as transpose reads them: row(i) points at row i's first float.
template <typename Row>
struct Rows {
  Row row;
  Packet packet(int64_t i, int64_t j) const { return load(row(i) + j); }
  float operator()(int64_t i, int64_t j) const { return row(i)[j]; }
};
template <typename Row>
Rows(Row) -> Rows<Row>;  // for compilers without C++20's deduction for aggregates (clang before 17)

// Floats on a 64-byte boundary, so that packets at multiples of kLanes never split a cache line.
using AlignedFloats = std::vector<float, Eigen::aligned_allocator<float>>;

// Floats in one core's L2 cache, as the C library reads it from the CPU (2 MiB on the Intel Xeon kind,
// 1 MiB on Zen 4 and 5, 512 KiB on Zen 3); 1 MiB where it cannot tell. Blocks that a kernel means to
// keep in L2 are sized by it, not by one machine's figure.
inline int64_t l2_floats() {
  static const int64_t floats = [] {
    const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return (bytes > 0 ? static_cast<int64_t>(bytes) : int64_t{1} << 20) / static_cast<int64_t>(sizeof(float));
  }();
  return floats;
}

// At least `floats` floats of the calling thread, one buffer per distinct Slot (an enumerator of the
// caller's), kept from call to call: kernels run every step, and fresh buffers of their size come from
// mmap and fault every page in again each time.
template <auto Slot>
float* thread_scratch(int64_t floats) {
  thread_local AlignedFloats buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(static_cast<std::size_t>(floats));
  return buffer.data();
}

// Non-temporal stores, for an output written once and read again only after it would have left the
// cache anyway: a plain store that misses reads its line from memory first, a streamed one does not,
// which takes a third off the traffic of a pass that reads one tensor and writes another. They need
// a destination aligned to a packet, and the vector ISA's streaming store (AVX or AVX-512).
#if defined(__AVX512F__) || defined(__AVX__)
constexpr bool kStreamingStores = true;
#else
constexpr bool kStreamingStores = false;
#endif
inline bool streamable(const float* to, int64_t n) {
  return kStreamingStores && reinterpret_cast<std::uintptr_t>(to) % (sizeof(float) * kLanes) == 0 &&
         n % kLanes == 0;
}

// to[0, n) = what write(piece, first, count) leaves in piece[0, count) for the elements [first, first +
// count), computed a few KiB at a time into a buffer in L1 and streamed out from there. The arithmetic
// is the caller's own loop, so the bits are those it would store; streamable(to, n) must hold.
// Streamed stores are weakly ordered: the caller fences (stream_fence) before another thread may read
// them, once for many calls (a fence waits for the stores to drain: one per plane took back most of
// what streaming gave BatchNorm).
template <typename Write>
void write_streamed(float* to, int64_t n, Write write) {
  constexpr int64_t kPiece = 1024;
  alignas(64) float piece[kPiece];
  for (int64_t first = 0; first < n; first += kPiece) {
    const int64_t count = std::min(kPiece, n - first);
    write(piece, first, count);
    if constexpr (!kStreamingStores) {
      // A portable build (no AVX: -DDPTRAIN_NATIVE=OFF, the GPU bundle's) stores plainly, same bits.
      std::copy_n(piece, count, to + first);
      continue;
    }
    for (int64_t i = 0; i < count; i += kLanes) {
#if defined(__AVX512F__)
      if constexpr (kLanes == 16) {
        _mm512_stream_ps(to + first + i, _mm512_load_ps(piece + i));
        continue;
      }
#endif
#if defined(__AVX__)
      if constexpr (kLanes == 8) _mm256_stream_ps(to + first + i, _mm256_load_ps(piece + i));
#endif
    }
  }
}
inline void stream_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

}  // namespace dptrain::cpu::simd
