// NumPy .npy files: a strict reader and a writer, and the "npy" dataset format built on them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/registry.h"

namespace dptrain::data {

// One array of a .npy file: a view into the file's bytes, C order.
struct NpyArray {
  std::string dtype;  // "u1", "f4" or "i8": the descr without its byte-order character
  std::vector<int64_t> shape;
  int64_t item_bytes;
  std::span<const uint8_t> data;
};

// Parses a whole .npy file (format versions 1.0, 2.0 and 3.0) already in memory. Accepts only the
// dtypes '|u1' / '<u1' (uint8), '<f4' (float32) and '<i8' (int64), C order, and data exactly as long
// as the shape says. Throws dptrain::Error whose message starts with the path on anything else.
NpyArray parse_npy(std::span<const uint8_t> file, const std::string& path);

// Writes a version 1.0 .npy file as numpy does, the header padded so the data starts at a multiple of
// 64 bytes. descr: "|u1", "<f4" or "<i8"; data: the array's bytes in C order, exactly as many as the
// shape needs. Throws dptrain::Error naming the path.
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               std::span<const uint8_t> data);

// The magic, version and header of such a file, for writers that stream the data after it.
std::string npy_header(const std::string& descr, const std::vector<int64_t>& shape);

// The "npy" dataset format: <dir>/train_x.npy and train_y.npy (test_x.npy and test_y.npy for the test
// split), mapped. x: uint8 or float32, [N, C, H, W] or [N, H, W] (one channel); y: int64 or uint8,
// [N], every label in [0, request.model_classes).
std::unique_ptr<Dataset> open_npy(const DatasetRequest& request);

}  // namespace dptrain::data
