// Gradient clipping by the global norm over ranges of the flat gradient buffer.
#include "optim/clip.h"

#include <cmath>

#include "core/backend.h"

namespace dptrain::optim {

float clip_factor(double norm, double max_norm) {
  if (!std::isfinite(norm)) return 1.0f;
  const double factor = max_norm / (norm + 1e-6);
  return factor < 1.0 ? static_cast<float>(factor) : 1.0f;
}

double gradient_sum_of_squares(const FlatParameters& parameters, std::span<const FlatRange> ranges) {
  Backend& backend = backend_for(parameters.device());
  double sum = 0;
  for (const FlatRange& r : ranges)
    sum += backend.sum_of_squares(parameters.grads().data_ptr() + r.offset, r.numel);
  return sum;
}

}  // namespace dptrain::optim
