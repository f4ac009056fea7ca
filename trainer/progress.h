// Progress reporting on rank 0: a live bar on a terminal, plain periodic lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dptrain::trainer {

class Progress {
 public:
  Progress(bool enabled, int64_t log_every_steps);
  void begin_epoch(int64_t epoch, int64_t epochs, int64_t steps);
  // Running means over the epoch so far; accuracy < 0 means "not a classifier" and is not shown.
  void update(int64_t step, double loss, double accuracy, double samples_per_sec);
  void end_epoch();
  // A line of its own (e.g. "checkpoint written"), below the bar rather than through it.
  void note(const std::string& line);

 private:
  bool enabled_, terminal_;
  int64_t log_every_steps_;
  int64_t epoch_ = 0, epochs_ = 0, steps_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace dptrain::trainer
