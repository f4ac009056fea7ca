// Fuzz target: the safetensors reader and, on what it accepts, the checkpoint validation that
// --resume and --evaluate apply (format version, checksums, position entries).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/safetensors.h"
#include "fuzz_target.h"
#include "trainer/checkpoint_file.h"

using namespace dptrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(data, data + size);
  fuzz::expect_accept_or_error("safetensors::parse / validate_checkpoint", [&] {
    safetensors::File file = safetensors::parse(bytes, "fuzz.safetensors");
    trainer::validate_checkpoint(std::move(file), "fuzz.safetensors");
  });
  return 0;
}
