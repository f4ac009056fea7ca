// Fuzz target: the PNG and JPEG decoder (libpng and libjpeg-turbo behind their error callbacks); an
// accepted image must be grey or RGB with exactly height x width x channels bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "data/image_codec.h"
#include "fuzz_target.h"

using namespace dptrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_accept_or_error("decode_image", [&] {
    const data::Image image = data::decode_image({data, size}, "fuzz input");
    if (image.channels != 1 && image.channels != 3) std::abort();
    if (image.height < 1 || image.width < 1) std::abort();
    if (static_cast<int64_t>(image.pixels.size()) != image.height * image.width * image.channels)
      std::abort();
  });
  return 0;
}
