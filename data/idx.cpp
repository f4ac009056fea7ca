// IDX reader: parses the header, then reads the payload through zlib (plain or gzip alike).
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace dptrain::data {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads up to n bytes; returns how many arrived (short only at end of file), throws on a zlib error
// (e.g. a corrupt .gz) so a damaged archive is not mistaken for a short one.
int64_t read_some(gzFile f, const std::string& path, uint8_t* out, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - got, INT_MAX / 2));
    const int r = gzread(f, out + got, chunk);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      DPTRAIN_FAIL(path, ": read error: ", msg ? msg : "unknown zlib error");
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

std::string hex32(uint32_t v) {
  char buf[11];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += 'x';  // appending in two steps dodges GCC 12's false -Wrestrict at -O3
    s += std::to_string(dims[i]);
  }
  return s;
}

// The magic's checks; returns the number of dims it declares.
int dims_in_magic(const uint8_t* magic, const std::string& path) {
  const uint32_t magic_value =
      (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) | (uint32_t{magic[2]} << 8) | magic[3];
  DPTRAIN_CHECK(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08, path, ": bad magic ", hex32(magic_value),
                ", expected 0x000008NN (unsigned-byte IDX, NN = number of dims); not an IDX ubyte file?");
  const int ndims = magic[3];
  DPTRAIN_CHECK(ndims >= 1 && ndims <= 4, path, ": magic ", hex32(magic_value), " declares ", ndims,
                " dims, supported are 1..4");
  return ndims;
}

// The big-endian dims after the magic, each positive; their product is the payload's size.
std::vector<int64_t> header_dims(const uint8_t* raw, int ndims, const std::string& path, int64_t& total) {
  std::vector<int64_t> dims;
  total = 1;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* d = raw + 4 * i;
    const int64_t dim = (int64_t{d[0]} << 24) | (int64_t{d[1]} << 16) | (int64_t{d[2]} << 8) | d[3];
    DPTRAIN_CHECK(dim > 0, path, ": dimension ", i, " is 0; every dimension must be positive");
    dims.push_back(dim);
    // 2^40 bytes is far beyond any IDX data set and keeps the product below int64 overflow.
    DPTRAIN_CHECK(total <= (int64_t{1} << 40) / dim, path, ": header dims ", dims_str(dims),
                  " are implausibly large");
    total *= dim;
  }
  return dims;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  // gzopen on a directory "succeeds" and fails later with a confusing read error; reject it here.
  DPTRAIN_CHECK(!std::filesystem::is_directory(path), path, ": is a directory, expected an IDX file");
  GzFile file(gzopen(path.c_str(), "rb"));
  DPTRAIN_CHECK(file != nullptr, path, ": cannot open (missing? run scripts/setup.sh to fetch MNIST, ",
                "or point data.dir at your IDX files)");
  gzFile f = file.get();

  uint8_t magic[4];
  const int64_t got_magic = read_some(f, path, magic, 4);
  DPTRAIN_CHECK(got_magic == 4, path, ": truncated: ", got_magic, " bytes, too short for an IDX header");
  const int ndims = dims_in_magic(magic, path);
  uint8_t raw_dims[16];
  const int64_t got_dims = read_some(f, path, raw_dims, 4 * ndims);
  DPTRAIN_CHECK(got_dims == 4 * ndims, path, ": truncated: header needs ", 4 * ndims,
                " bytes of dimensions, file has ", got_dims);
  IdxArray out;
  int64_t total = 0;
  out.dims = header_dims(raw_dims, ndims, path, total);

  // Grow the buffer as data arrives, doubling from 64 KiB up to 16 MiB steps, rather than trusting the
  // header with one huge allocation: a 30-byte file that claims a terabyte costs 64 KiB.
  constexpr int64_t kFirstChunk = int64_t{1} << 16, kLargestChunk = int64_t{1} << 24;
  int64_t have = 0;
  while (have < total) {
    const int64_t want = std::min({std::clamp(have, kFirstChunk, kLargestChunk), total - have});
    out.bytes.resize(static_cast<std::size_t>(have + want));
    const int64_t got = read_some(f, path, out.bytes.data() + have, want);
    have += got;
    if (got < want) break;
  }
  DPTRAIN_CHECK(have == total, path, ": truncated: header (", dims_str(out.dims), ") says ", total,
                " data bytes, file has ", have);

  uint8_t extra[4096];
  int64_t trailing = 0;
  for (int64_t got; (got = read_some(f, path, extra, sizeof extra)) > 0;) trailing += got;
  DPTRAIN_CHECK(trailing == 0, path, ": ", trailing, " trailing bytes after the ", total,
                " data bytes the header (", dims_str(out.dims), ") describes");
  return out;
}

IdxView parse_idx(std::span<const uint8_t> file, const std::string& path) {
  DPTRAIN_CHECK(file.size() >= 4, path, ": truncated: ", file.size(), " bytes, too short for an IDX header");
  const int ndims = dims_in_magic(file.data(), path);
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndims);
  DPTRAIN_CHECK(file.size() >= header, path, ": truncated: header needs ", 4 * ndims,
                " bytes of dimensions, file has ", file.size() - 4);
  IdxView out;
  int64_t total = 0;
  out.dims = header_dims(file.data() + 4, ndims, path, total);
  const int64_t have = static_cast<int64_t>(file.size() - header);
  DPTRAIN_CHECK(have >= total, path, ": truncated: header (", dims_str(out.dims), ") says ", total,
                " data bytes, file has ", have);
  DPTRAIN_CHECK(have == total, path, ": ", have - total, " trailing bytes after the ", total,
                " data bytes the header (", dims_str(out.dims), ") describes");
  out.bytes = file.subspan(header);
  return out;
}

std::string resolve_idx_path(const std::string& dir, const std::string& stem) {
  const std::filesystem::path plain = std::filesystem::path(dir) / stem;
  if (std::filesystem::exists(plain)) return plain.string();
  const std::string gz = plain.string() + ".gz";
  if (std::filesystem::exists(gz)) return gz;
  DPTRAIN_FAIL(plain.string(), ": not found (nor ", gz, "); run scripts/setup.sh to fetch MNIST, ",
               "or point data.dir at a directory with IDX files");
}

}  // namespace dptrain::data
