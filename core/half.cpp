// Buffer conversions between float and fp16/bf16.
#include "core/half.h"

namespace dptrain {

void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format) {
  if (format == HalfFormat::kFp16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i] * scale);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bfloat16(src[i] * scale);
  }
}

void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format) {
  if (format == HalfFormat::kFp16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(src[i]);
  }
}

void add_halves(const uint16_t* in, uint16_t* inout, int64_t n, HalfFormat format) {
  if (format == HalfFormat::kFp16) {
    for (int64_t i = 0; i < n; ++i) inout[i] = float_to_half(half_to_float(in[i]) + half_to_float(inout[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) inout[i] = float_to_bfloat16(bfloat16_to_float(in[i]) + bfloat16_to_float(inout[i]));
  }
}

}  // namespace dptrain
