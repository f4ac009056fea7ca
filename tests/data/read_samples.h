// Test helper: every sample of a Dataset read in index order into flat vectors.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace dptrain::data {

struct Samples {
  std::vector<float> inputs;  // size x sample_numel, before normalisation
  std::vector<int32_t> labels;
  std::vector<float> targets;
};

inline Samples read_samples(const Dataset& ds) {
  Samples out;
  const int64_t numel = ds.sample_numel(), width = ds.target_width();
  out.inputs.resize(static_cast<std::size_t>(ds.size() * numel));
  out.targets.resize(static_cast<std::size_t>(ds.size() * width));
  for (int64_t i = 0; i < ds.size(); ++i)
    out.labels.push_back(
        ds.read(i, out.inputs.data() + i * numel, width > 0 ? out.targets.data() + i * width : nullptr));
  return out;
}

}  // namespace dptrain::data
