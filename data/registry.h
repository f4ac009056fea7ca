// The registry of dataset formats by name (data.dataset): one line per format in data/registry.cpp.
// A format opens a split from a request holding everything the config's data section says; samples
// are read later, batch by batch (data/loader.h), so opening costs little whatever the data set's size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/synthetic.h"

namespace dptrain::data {

struct DatasetRequest {
  bool train = true;
  std::string dir{};
  int64_t max_samples = 0;           // 0: all
  int64_t resize = 0;                // image_folder: the shorter side first resized to this; 0: as stored
  uint64_t seed = 0;                 // generated data: train uses it, test seed + 1
  Shape sample_shape{};              // model.input_shape
  int64_t model_classes = 0;         // the model's output width (0 unless its output is [classes])
  LinearDataOptions linear{};        // "linear"
  SyntheticDataOptions synthetic{};  // "synthetic"
};

struct DatasetEntry {
  const char* name;
  std::unique_ptr<Dataset> (*open)(const DatasetRequest& request);
  const char* default_dir;  // data.dir when the config leaves it out; "" for generated data
  const char* source;       // how the summary names the data; "" to name data.dir
};

// An unknown name throws, listing the registered ones.
const DatasetEntry& dataset_format(const std::string& name);
std::vector<std::string> dataset_names();

}  // namespace dptrain::data
