// Phase: a scope's duration added to one of the step's time counters, and its span on the timeline.
#pragma once

#include <chrono>

#include "core/timeline.h"

namespace dptrain::trainer {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class Phase {
 public:
  Phase(double& seconds, const char* name) : seconds_(seconds), span_(name, "step") {}
  ~Phase() { seconds_ += seconds_since(start_); }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  double& seconds_;
  timeline::Span span_;
  Clock::time_point start_ = Clock::now();
};

}  // namespace dptrain::trainer
