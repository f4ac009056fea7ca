// Rng: a small, portable, seedable generator (SplitMix64) so runs replay bit-for-bit on any
// platform; std:: distributions are implementation-defined, these are not. SplitMix64 is a counter
// passed through a mixer, so the k-th draw after any state is computable directly: a device kernel
// draws element i of a dropout mask without a sequential pass, and gets the CPU's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

#include "core/host_device.h"

namespace dptrain {

inline constexpr uint64_t kSplitMixIncrement = 0x9E3779B97F4A7C15ull;

// The value next_u64() returns as the (k+1)-th draw from `state`, k = 0, 1, ...
DPTRAIN_HOST_DEVICE inline uint64_t splitmix64_draw(uint64_t state, uint64_t k) {
  uint64_t z = state + (k + 1) * kSplitMixIncrement;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits: exact in float.
DPTRAIN_HOST_DEVICE inline float uniform_from_bits(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}

  uint64_t next_u64() {
    const uint64_t out = splitmix64_draw(state_, 0);
    state_ += kSplitMixIncrement;
    return out;
  }
  float uniform() { return uniform_from_bits(next_u64()); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller on two draws), the same on every platform.
  double normal() {
    const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  // Uniform integer in [0, n) without modulo bias worth mentioning for n << 2^64.
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }

  // The state before the next draw, and a jump over `draws` draws: a kernel that takes draws
  // [0, n) from state() with splitmix64_draw leaves the stream where skip(n) puts it.
  uint64_t state() const { return state_; }
  void skip(uint64_t draws) { state_ += draws * kSplitMixIncrement; }

 private:
  uint64_t state_;
};

// A seed derived from a base seed and a name (FNV-1a), so e.g. each parameter's init does not
// depend on how many parameters came before it.
inline uint64_t derive_seed(uint64_t base, std::string_view name) {
  uint64_t h = 14695981039346656037ull ^ base;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace dptrain
