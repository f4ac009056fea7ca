// The "fp64" wire encoding: gradients summed in double precision, at twice the bytes of fp32. An
// element's sum is then exact whenever its terms on the N ranks lie within a factor of
// 2^(29 - log2 N) of each other, so the average no longer depends on the order in which MPI adds
// them, which changes with the message size and so with the bucket layout. Host memory only: the
// conversion is a loop here, not a backend kernel.
#include <algorithm>

#include "distributed/gradient_encoding.h"

namespace dptrain::distributed {
namespace {

void encode_fp64(Backend& /*backend*/, const float* gradients, void* wire, int64_t n) {
  std::copy_n(gradients, n, static_cast<double*>(wire));
}
void decode_fp64(Backend& /*backend*/, const void* wire, float* gradients, int64_t n) {
  const double* sums = static_cast<const double*>(wire);
  std::transform(sums, sums + n, gradients, [](double s) { return static_cast<float>(s); });
}

}  // namespace

extern const GradientEncoding kFp64Encoding = {.name = "fp64",
                                               .bytes_per_element = sizeof(double),
                                               .wire_type = DataType::kF64,
                                               .encode = encode_fp64,
                                               .decode = decode_fp64,
                                               .overflow_hint = "",
                                               .host_only = true};

}  // namespace dptrain::distributed
