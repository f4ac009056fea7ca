// Reading and writing the safetensors format: 8-byte little-endian header length, a JSON header
// mapping names to {dtype, shape, data_offsets} plus "__metadata__" (string -> string), then data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dptrain::safetensors {

struct File {
  std::vector<NamedTensor> tensors;  // in file order
  std::map<std::string, std::string> metadata;

  const Tensor* find(const std::string& name) const;
};

// Serialises F32 tensors (names in the given order, data packed in that order) and metadata.
std::vector<char> serialize(const std::vector<NamedTensor>& tensors,
                            const std::map<std::string, std::string>& metadata = {});
// Parses a whole file image; every defect (short header, bad JSON, offsets out of range or
// overlapping, unsupported dtype, shape/size mismatch) throws dptrain::Error naming `source`.
File parse(const std::vector<char>& bytes, const std::string& source);

// Plain write (no durability dance; checkpoints add temp file + fsync + rename on top).
void save(const std::string& path, const std::vector<NamedTensor>& tensors,
          const std::map<std::string, std::string>& metadata = {});
File load(const std::string& path);

}  // namespace dptrain::safetensors
