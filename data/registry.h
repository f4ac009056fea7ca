// The registry of dataset formats by name (data.dataset): one line per format in data/registry.cpp.
// A format loads a split from a request holding everything the config's data section says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/synthetic.h"

namespace dptrain::data {

struct DatasetRequest {
  bool train = true;
  std::string dir{};
  float mean = 0, std = 1;           // pixels become (p / 255 - mean) / std
  int64_t max_samples = 0;           // 0: all
  uint64_t seed = 0;                 // generated data: train uses it, test seed + 1
  Shape sample_shape{};              // model.input_shape
  int64_t model_classes = 0;         // the model's output width (0 unless its output is [classes])
  LinearDataOptions linear{};        // "linear"
  SyntheticDataOptions synthetic{};  // "synthetic"
};

struct DatasetEntry {
  const char* name;
  Dataset (*load)(const DatasetRequest& request);
  const char* default_dir;  // data.dir when the config leaves it out; "" for generated data
  const char* source;       // how the summary names the data; "" to name data.dir
};

// An unknown name throws, listing the registered ones.
const DatasetEntry& dataset_format(const std::string& name);
std::vector<std::string> dataset_names();

}  // namespace dptrain::data
