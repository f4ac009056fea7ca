// The wire encodings of the bucketed allreduce ("none", "fp16", "bf16", "fp64"), looked up by name:
// what distributed.compression names when it does not name a gradient-sync strategy of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

struct GradientEncoding {
  const char* name;
  int64_t bytes_per_element;  // on the wire
  DataType wire_type;         // what the allreduce sums
  // Into the wire buffer and back. Null for an encoding that reduces the fp32 gradients in place.
  void (*encode)(Backend& backend, const float* gradients, void* wire, int64_t n);
  void (*decode)(Backend& backend, const void* wire, float* gradients, int64_t n);
  const char* overflow_hint;  // appended to the non-finite-average error; "" when none applies
  bool host_only = false;     // encode and decode are host loops: CPU runs only
};

// The encoding called `name`; an unknown name throws, listing the registered ones.
const GradientEncoding& gradient_encoding(const std::string& name);
std::vector<std::string> gradient_encoding_names();

}  // namespace dptrain::distributed
