// Fuzz target: the .npy parser, on the input bytes as the whole file; an accepted array must have
// exactly the data bytes its shape and dtype promise.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "data/npy.h"
#include "fuzz_target.h"

using namespace dptrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_accept_or_error("parse_npy", [&] {
    const data::NpyArray array = data::parse_npy(std::span<const uint8_t>(data, size), "fuzz.npy");
    // A zero dim makes the product 0 however large the others are (numpy accepts (2**62, 2**62, 0)).
    int64_t total = std::ranges::find(array.shape, 0) != array.shape.end() ? 0 : array.item_bytes;
    for (const int64_t d : array.shape)
      if (d < 0 || (total != 0 && __builtin_mul_overflow(total, d, &total))) std::abort();
    if (static_cast<int64_t>(array.data.size()) != total) std::abort();
  });
  return 0;
}
