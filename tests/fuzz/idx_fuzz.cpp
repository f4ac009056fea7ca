// Fuzz target: the IDX reader (raw or gzip-compressed, as MNIST ships), through a memory-backed file
// since read_idx takes a path, and parse_idx on the bytes themselves; an accepted array must have
// exactly the bytes its header promises.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/idx.h"
#include "fuzz_target.h"

using namespace dptrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("idx_fuzz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  fuzz::expect_accept_or_error("read_idx", [&] {
    const data::IdxArray array = data::read_idx(path);
    int64_t total = 1;
    for (const int64_t d : array.dims) total *= d;
    if (static_cast<int64_t>(array.bytes.size()) != total) std::abort();
  });
  // The same bytes as a mapped, uncompressed file: the view must agree with the reader.
  fuzz::expect_accept_or_error("parse_idx", [&] {
    const data::IdxView view = data::parse_idx({data, size}, "fuzz.idx");
    int64_t total = 1;
    for (const int64_t d : view.dims) total *= d;
    if (static_cast<int64_t>(view.bytes.size()) != total || view.bytes.data() + total != data + size)
      std::abort();
  });
  return 0;
}
