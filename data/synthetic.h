// Synthetic datasets: linear regression with known coefficients (the classic ring-allreduce demo).
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace dptrain::data {

// `samples` rows of features x_j ~ N(j, 1) (means 0, 1, 2, ...) and targets x . coefficients
// (+ N(0, noise^2)), seeded. sample_shape {features}, one target per sample, no labels.
Dataset make_linear_dataset(int64_t samples, const std::vector<double>& coefficients, double noise,
                            uint64_t seed);

}  // namespace dptrain::data
