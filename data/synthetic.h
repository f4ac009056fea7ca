// Synthetic datasets: linear regression with known coefficients (the classic ring-allreduce demo),
// and random images with random labels (Horovod's synthetic benchmark).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset.h"

namespace dptrain::data {

// The config's data.linear and data.synthetic sections: how many samples each split holds.
struct LinearDataOptions {
  int64_t samples{};
  int64_t test_samples{};
  std::vector<double> coefficients{};
  double noise{};
};
// Horovod's synthetic benchmark data: seeded N(0, 1) images of model.input_shape, uniform labels.
struct SyntheticDataOptions {
  int64_t samples{};
  int64_t test_samples{};
};

// `samples` rows of features x_j ~ N(j, 1) (means 0, 1, 2, ...) and targets x . coefficients
// (+ N(0, noise^2)), seeded. sample_shape {features}, one target per sample, no labels.
std::unique_ptr<Dataset> make_linear_dataset(int64_t samples, const std::vector<double>& coefficients,
                                             double noise, uint64_t seed);

// `samples` images of `sample_shape` with N(0, 1) pixels and labels uniform in [0, classes), seeded:
// what Horovod's synthetic benchmark feeds, for throughput without a dataset on disk.
std::unique_ptr<Dataset> make_random_images(int64_t samples, const Shape& sample_shape, int classes,
                                            uint64_t seed);

}  // namespace dptrain::data
