// fp16/bf16 conversions: the portable bit-manipulation conversions agree with the hardware's (F16C)
// on every half value and on a sweep of float bit patterns, the buffer conversions (vectorised for
// fp16) agree with the scalar ones element by element, tails included, and closed-form values.
#include "core/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace dptrain {
namespace {

float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Half, ClosedFormValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);                      // largest finite half
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);                      // rounds up to infinity
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie rounds to even
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16_to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  // Any NaN, whatever its sign and payload (a GPU's canonical 0x7fffffff too), is PyTorch's 0x7fc0.
  for (const uint32_t nan : {0x7fc00000u, 0x7fffffffu, 0xffc00001u, 0x7f800001u})
    EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(nan)), 0x7fc0) << std::hex << nan;
}

TEST(Half, PortableMatchesHardwareOnEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = half_to_float(static_cast<uint16_t>(h)),
                b = half_to_float_portable(static_cast<uint16_t>(h));
    if (std::isnan(a)) {
      ASSERT_TRUE(std::isnan(b)) << std::hex << h;
    } else {
      ASSERT_EQ(a, b) << std::hex << h;
      ASSERT_EQ(std::signbit(a), std::signbit(b)) << std::hex << h;
    }
  }
}

TEST(Half, PortableMatchesHardwareOnFloatSweep) {
  // Every 997th bit pattern: all exponents, subnormals, overflow and rounding boundaries.
  for (uint64_t x = 0; x < (1ull << 32); x += 997) {
    const float f = bits_to_float(static_cast<uint32_t>(x));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), float_to_half_portable(f)) << std::hex << x;
  }
}

TEST(Half, BufferConversionsMatchScalar) {
  Rng rng(7);
  for (int64_t n : {1, 7, 8, 9, 1000, 1031}) {
    std::vector<float> src(n), back(n);
    for (float& v : src) v = rng.uniform(-70000.0f, 70000.0f) * (rng.uniform() < 0.3f ? 1e-6f : 1.0f);
    std::vector<uint16_t> half(n), other(n);
    for (HalfFormat format : {HalfFormat::kFp16, HalfFormat::kBf16}) {
      const bool fp16 = format == HalfFormat::kFp16;
      floats_to_halves(src.data(), half.data(), n, 0.25f, format);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(half[i], fp16 ? float_to_half(src[i] * 0.25f) : float_to_bfloat16(src[i] * 0.25f))
            << n << " " << i;
      halves_to_floats(half.data(), back.data(), n, format);
      for (int64_t i = 0; i < n; ++i) {
        const float expect = fp16 ? half_to_float(half[i]) : bfloat16_to_float(half[i]);
        ASSERT_EQ(back[i], expect) << n << " " << i;
      }
      floats_to_halves(src.data(), other.data(), n, 0.5f, format);
      std::vector<uint16_t> sum = half;
      add_halves(other.data(), sum.data(), n, format);
      for (int64_t i = 0; i < n; ++i) {
        const float a = fp16 ? half_to_float(other[i]) : bfloat16_to_float(other[i]);
        const float b = fp16 ? half_to_float(half[i]) : bfloat16_to_float(half[i]);
        ASSERT_EQ(sum[i], fp16 ? float_to_half(a + b) : float_to_bfloat16(a + b)) << n << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace dptrain
