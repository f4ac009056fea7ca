// IEEE binary16 (fp16) and bfloat16 conversions, scalar and over buffers, round-to-nearest-even.
// Used by gradient compression; kept in core so a GPU backend can share the definitions.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace dptrain {

// Portable conversions (bit manipulation), shared with the CUDA kernels; the F16C instructions are
// used on the CPU instead where present, and a test checks that both agree on every half value and
// on rounding boundaries.
DPTRAIN_HOST_DEVICE inline uint16_t float_to_half_portable(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));  // inf/nan
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);               // overflow
  if (abs < 0x38800000u) {  // subnormal half (or zero): align to 2^-24 units with rounding
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 113 - static_cast<int>(abs >> 23) + 13;
    if (shift > 24) return static_cast<uint16_t>(sign);
    const uint32_t rounded = (mant + (1u << (shift - 1)) - 1 + ((mant >> shift) & 1)) >> shift;
    return static_cast<uint16_t>(sign | rounded);
  }
  abs += 0xc8000000u;                  // rebias exponent 127 -> 15
  abs += 0x0fffu + ((abs >> 13) & 1);  // round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
}

DPTRAIN_HOST_DEVICE inline float half_to_float_portable(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | ((112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline uint16_t float_to_half(float value) {
#if defined(__F16C__)
  return _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT);
#else
  return float_to_half_portable(value);
#endif
}

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return half_to_float_portable(h);
#endif
}

DPTRAIN_HOST_DEVICE inline uint16_t float_to_bfloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  // Every NaN becomes the one quiet NaN, as PyTorch's c10::BFloat16 makes it: a payload would not
  // survive anyway, since a GPU's arithmetic (x * scale) already replaces it with its own NaN.
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

DPTRAIN_HOST_DEVICE inline float bfloat16_to_float(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &x, 4);
  return out;
}

enum class HalfFormat { kFp16, kBf16 };

// dst[i] = to_half(src[i] * scale)
void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format);
// dst[i] = from_half(src[i])
void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format);
// inout[i] = to_half(from_half(in[i]) + from_half(inout[i])): a sum in half precision.
void add_halves(const uint16_t* in, uint16_t* inout, int64_t n, HalfFormat format);

}  // namespace dptrain
