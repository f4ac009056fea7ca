// Dataset: samples held in memory as normalised floats plus labels, and the MNIST-layout loader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dptrain::data {

struct Dataset {
  Shape sample_shape;           // e.g. {1, 28, 28}
  int64_t size = 0;             // number of samples
  std::vector<float> inputs;    // size * shape_numel(sample_shape), normalised, sample-major
  std::vector<int32_t> labels;  // size class indices in [0, num_classes)
  int num_classes = 0;
  std::vector<float> targets;  // regression targets, size * width; empty for classification
};

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte (each plain or .gz) from dir: MNIST and
// Fashion-MNIST share this layout. Pixels become (p/255 - mean) / std_dev; sample_shape {1, rows, cols}.
// max_samples > 0 keeps only the first max_samples (as keep_first would, without converting the rest).
Dataset load_image_dataset(const std::string& dir, bool train, float mean, float std_dev,
                           int64_t max_samples = 0);

// Keeps the first `n` samples (all when n is 0 or not smaller than the size).
void keep_first(Dataset& ds, int64_t n);

}  // namespace dptrain::data
