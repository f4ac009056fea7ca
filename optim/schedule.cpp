// Learning-rate schedule.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace dptrain::optim {

LrSchedule::LrSchedule(ScheduleOptions options) : o_(options) {
  DPTRAIN_CHECK(o_.step_size_epochs > 0, "optimizer.step_size_epochs must be > 0");
  scaled_ = o_.scaling == LrScaling::kLinear ? o_.base_lr * o_.world_size * o_.backward_passes_per_step
                                             : o_.base_lr;
}

double LrSchedule::at(double epoch) const {
  const double w = o_.warmup_epochs;
  if (w > 0 && epoch < w) {
    // Horovod's LearningRateWarmupCallback: from scaled/size at e = 0 to scaled at e = w.
    const double size = o_.world_size;
    return scaled_ / size * ((size - 1) / w * epoch + 1);
  }
  const double after = epoch - w;
  switch (o_.decay) {
    case Decay::kStep: {
      // The trainer's epoch is samples / dataset size: a boundary may come a rounding short of its
      // whole number of periods (1 + 24000 / 60000 - 0.4 is 0.9999999999999999), and floor alone
      // would decay one step late. The rounding is a few ulps of epoch / step_size_epochs; one sample
      // short of a boundary is 1 / (size x step_size_epochs) periods, far more for any data set.
      const double periods = after / o_.step_size_epochs, nearest = std::round(periods);
      const bool on_boundary =
          std::fabs(periods - nearest) <= 1e-12 * std::max(1.0, epoch / o_.step_size_epochs);
      return scaled_ * std::pow(o_.gamma, on_boundary ? nearest : std::floor(periods));
    }
    case Decay::kCosine: {
      const double span = std::max(o_.total_epochs - w, 1e-12);
      const double t = std::min(after / span, 1.0);
      return o_.min_lr + (scaled_ - o_.min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * t));
    }
    case Decay::kConstant:
      break;
  }
  return scaled_;
}

}  // namespace dptrain::optim
