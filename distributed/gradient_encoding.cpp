// The registry of wire encodings: one line per encoding in kEncodings.
#include "distributed/gradient_encoding.h"

#include "core/registry.h"

namespace dptrain::distributed {

// Defined in their own files.
extern const GradientEncoding kNoEncoding, kFp16Encoding, kBf16Encoding, kFp64Encoding;

namespace {
const GradientEncoding* const kEncodings[] = {&kNoEncoding, &kFp16Encoding, &kBf16Encoding, &kFp64Encoding};
}  // namespace

std::vector<std::string> gradient_encoding_names() {
  return registered_names<GradientEncoding>(kEncodings);
}

const GradientEncoding& gradient_encoding(const std::string& name) {
  return find_registered<GradientEncoding>(kEncodings, name, "gradient encoding");
}

}  // namespace dptrain::distributed
