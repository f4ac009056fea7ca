// Rng: a small, portable, seedable generator (SplitMix64) so runs replay bit-for-bit on any
// platform; std:: distributions are implementation-defined, these are not.
#pragma once

#include <cstdint>
#include <string_view>

namespace dptrain {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits: exact in float.
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n) without modulo bias worth mentioning for n << 2^64.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64); }

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
