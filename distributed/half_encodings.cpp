// The fp32 in-place "encoding" and the two half-precision ones (IEEE fp16, bfloat16). Gradients are
// already divided by the world size when they are encoded, so a half-precision sum cannot overflow
// unless the average itself does.
#include "distributed/gradient_encoding.h"

namespace dptrain::distributed {

extern const GradientEncoding kNoEncoding = {.name = "none",
                                             .bytes_per_element = sizeof(float),
                                             .wire_type = DataType::kF32,
                                             .encode = nullptr,
                                             .decode = nullptr,
                                             .overflow_hint = ""};

namespace {
template <HalfFormat format>
void encode_half(Backend& backend, const float* gradients, void* wire, int64_t n) {
  backend.to_half(gradients, static_cast<uint16_t*>(wire), n, 1.0f, format);
}
template <HalfFormat format>
void decode_half(Backend& backend, const void* wire, float* gradients, int64_t n) {
  backend.from_half(static_cast<const uint16_t*>(wire), gradients, n, format);
}
constexpr const char* kHalfOverflowHint =
    " or set distributed.compression to \"none\" (fp16 overflows past 65504)";
}  // namespace

extern const GradientEncoding kFp16Encoding = {.name = "fp16",
                                               .bytes_per_element = sizeof(uint16_t),
                                               .wire_type = DataType::kF16,
                                               .encode = encode_half<HalfFormat::kFp16>,
                                               .decode = decode_half<HalfFormat::kFp16>,
                                               .overflow_hint = kHalfOverflowHint};
extern const GradientEncoding kBf16Encoding = {.name = "bf16",
                                               .bytes_per_element = sizeof(uint16_t),
                                               .wire_type = DataType::kBf16,
                                               .encode = encode_half<HalfFormat::kBf16>,
                                               .decode = decode_half<HalfFormat::kBf16>,
                                               .overflow_hint = kHalfOverflowHint};

}  // namespace dptrain::distributed
