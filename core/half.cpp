// Buffer conversions between float and fp16/bf16. fp16 uses the F16C instructions 8 lanes at a time
// where the CPU has them (the scalar loop would not vectorise: each element is an intrinsic call).
#include "core/half.h"

namespace dptrain {

void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format) {
  int64_t i = 0;
  if (format == HalfFormat::kFp16) {
#if defined(__F16C__)
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + i), s);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; ++i) dst[i] = float_to_half(src[i] * scale);
  } else {
    for (; i < n; ++i) dst[i] = float_to_bfloat16(src[i] * scale);
  }
}

void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format) {
  int64_t i = 0;
  if (format == HalfFormat::kFp16) {
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) dst[i] = half_to_float(src[i]);
  } else {
    for (; i < n; ++i) dst[i] = bfloat16_to_float(src[i]);
  }
}

void add_halves(const uint16_t* in, uint16_t* inout, int64_t n, HalfFormat format) {
  int64_t i = 0;
  if (format == HalfFormat::kFp16) {
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
      const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i),
                       _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; ++i) inout[i] = float_to_half(half_to_float(in[i]) + half_to_float(inout[i]));
  } else {
    for (; i < n; ++i) inout[i] = float_to_bfloat16(bfloat16_to_float(in[i]) + bfloat16_to_float(inout[i]));
  }
}

}  // namespace dptrain
