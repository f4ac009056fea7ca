// Linear-regression dataset and random images, generated in memory.
#include "data/synthetic.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/rng.h"

namespace dptrain::data {

std::unique_ptr<Dataset> make_linear_dataset(int64_t samples, const std::vector<double>& coefficients,
                                             double noise, uint64_t seed) {
  DPTRAIN_CHECK(samples > 0 && !coefficients.empty(),
                "linear dataset needs samples > 0 and at least one coefficient");
  const int64_t features = static_cast<int64_t>(coefficients.size());
  std::vector<float> inputs(static_cast<std::size_t>(samples * features)),
      targets(static_cast<std::size_t>(samples));
  Rng rng(derive_seed(seed, "linear"));
  for (int64_t i = 0; i < samples; ++i) {
    double y = 0;
    for (int64_t j = 0; j < features; ++j) {
      const double x = static_cast<double>(j) + rng.normal();
      inputs[i * features + j] = static_cast<float>(x);
      y += x * coefficients[j];
    }
    targets[i] = static_cast<float>(y + noise * rng.normal());
  }
  return std::make_unique<InMemoryDataset>(Shape{features}, std::move(inputs), std::vector<int32_t>{}, 0,
                                           std::move(targets));
}

std::unique_ptr<Dataset> make_random_images(int64_t samples, const Shape& sample_shape, int classes,
                                            uint64_t seed) {
  DPTRAIN_CHECK(samples > 0 && classes > 0, "synthetic images need samples > 0 and classes > 0");
  std::vector<float> inputs(static_cast<std::size_t>(samples * shape_numel(sample_shape)));
  std::vector<int32_t> labels(static_cast<std::size_t>(samples));
  Rng rng(derive_seed(seed, "synthetic images"));
  for (float& v : inputs) v = static_cast<float>(rng.normal());
  for (int32_t& label : labels) label = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  return std::make_unique<InMemoryDataset>(sample_shape, std::move(inputs), std::move(labels), classes);
}

}  // namespace dptrain::data
