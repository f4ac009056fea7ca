// Fuzz target: the config reader. The first byte picks the form: even, the rest is a config file
// for read_json_file and parse_config (what --config gives); odd, the rest is lines of --set
// assignments applied to configs/mnist.json's content, then parse_config (what the command line gives).
// Either way an accepted config then takes main's path to the other ranks: dumped, parsed again.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "fuzz_target.h"
#include "trainer/config.h"

using namespace dptrain;

namespace {

// configs/mnist.json as shipped, so the target needs no file.
const char* const kMnist = R"({
  "seed": 42, "output_dir": "runs/mnist",
  "data": {"dataset": "mnist", "dir": "data/mnist", "batch_size": 128},
  "model": {"input_shape": [1, 28, 28], "layers": [
    {"type": "conv2d", "out_channels": 32, "kernel": 5}, {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "dense", "out_features": 10}]},
  "optimizer": {"type": "adam", "lr": 0.001}, "training": {"epochs": 5}})";

// main(): rank 0 validates, then every rank parses rank 0's text; both must agree.
void accepted_by_every_rank(const Json& json) {
  const trainer::Config config = trainer::parse_config(json);
  const trainer::Config again = trainer::parse_config(Json::parse(json.dump()));
  if (trainer::to_json(config) != trainer::to_json(again)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    // read_json_file takes a path: a memory-backed file, rewritten for each input.
    static const int fd = ::memfd_create("config_fuzz", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
      std::abort();
    fuzz::expect_accept_or_error("read_json_file / parse_config", [&] {
      accepted_by_every_rank(trainer::read_json_file("/proc/self/fd/" + std::to_string(fd)));
    });
    return 0;
  }
  fuzz::expect_accept_or_error("--set", [&] {
    Json json = Json::parse(kMnist);
    std::istringstream lines(text);
    for (std::string assignment; std::getline(lines, assignment);) trainer::apply_override(json, assignment);
    accepted_by_every_rank(json);
  });
  return 0;
}
