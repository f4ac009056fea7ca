// IDX reader: the unsigned-byte IDX files MNIST ships in, raw or gzip-compressed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dptrain::data {

// One IDX array: dims as in the header (outermost first), payload in file order.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

// Reads an unsigned-byte IDX file (magic 0x0000080N, N = number of dims, 1..4), plain or gzipped.
// Throws dptrain::Error whose message starts with the path on any malformed or missing file,
// including a payload shorter or longer than the header promises.
IdxArray read_idx(const std::string& path);

// The same checks on a file already in memory (a mapped, uncompressed IDX file): the header's dims
// and a view of the payload, which must be exactly as long as the header says.
struct IdxView {
  std::vector<int64_t> dims;
  std::span<const uint8_t> bytes;
};
IdxView parse_idx(std::span<const uint8_t> file, const std::string& path);

// dir/stem if it exists, else dir/stem.gz if it exists; otherwise throws naming both.
std::string resolve_idx_path(const std::string& dir, const std::string& stem);

}  // namespace dptrain::data
