// Linear-regression dataset.
#include "data/synthetic.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/rng.h"

namespace dptrain::data {
namespace {
// Box-Muller on the portable generator, so the data set is the same on every platform.
double standard_normal(Rng& rng) {
  const double u1 = (static_cast<double>(rng.next_u64() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}
}  // namespace

Dataset make_linear_dataset(int64_t samples, const std::vector<double>& coefficients, double noise,
                            uint64_t seed) {
  DPTRAIN_CHECK(samples > 0 && !coefficients.empty(),
                "linear dataset needs samples > 0 and at least one coefficient");
  const int64_t features = static_cast<int64_t>(coefficients.size());
  Dataset ds;
  ds.sample_shape = {features};
  ds.size = samples;
  ds.inputs.resize(samples * features);
  ds.targets.resize(samples);
  ds.labels.assign(samples, 0);
  Rng rng(derive_seed(seed, "linear"));
  for (int64_t i = 0; i < samples; ++i) {
    double y = 0;
    for (int64_t j = 0; j < features; ++j) {
      const double x = static_cast<double>(j) + standard_normal(rng);
      ds.inputs[i * features + j] = static_cast<float>(x);
      y += x * coefficients[j];
    }
    ds.targets[i] = static_cast<float>(y + noise * standard_normal(rng));
  }
  return ds;
}

}  // namespace dptrain::data
