// Fuzz target: the CIFAR record reader. The input becomes a CIFAR-10 test_batch.bin or, when its
// first byte is odd, a CIFAR-100 test.bin, in a scratch folder; an accepted file's every record must
// read with a label below the variant's classes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "data/registry.h"
#include "fuzz_target.h"

using namespace dptrain;

namespace fs = std::filesystem;

namespace {
// The reader opens a folder, not bytes: one per process, removed when it exits normally (a crash
// keeps it, with the input that crashed).
struct ScratchFolder {
  fs::path path = fs::temp_directory_path() / ("cifar_fuzz." + std::to_string(::getpid()));
  ScratchFolder() { fs::create_directories(path); }
  ~ScratchFolder() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchFolder scratch;
  const fs::path& dir = scratch.path;
  const bool hundred = size > 0 && (data[0] & 1) != 0;
  fs::remove(dir / "test_batch.bin");
  fs::remove(dir / "test.bin");
  std::ofstream(dir / (hundred ? "test.bin" : "test_batch.bin"), std::ios::binary)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  fuzz::expect_accept_or_error("open_cifar", [&] {
    const auto dataset = data::dataset_format("cifar").open({.train = false, .dir = dir.string()});
    if (dataset->num_classes() != (hundred ? 100 : 10)) std::abort();
    std::vector<float> pixels(static_cast<std::size_t>(dataset->sample_numel()));
    for (int64_t i = 0; i < dataset->size(); ++i) {
      const int32_t label = dataset->read(i, pixels.data(), nullptr);
      if (label < 0 || label >= dataset->num_classes()) std::abort();
      for (const float p : pixels)
        if (!(p >= 0.0f && p <= 1.0f)) std::abort();
    }
  });
  return 0;
}
