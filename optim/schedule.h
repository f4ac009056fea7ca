// Learning-rate schedule: linear scaling by world size (Goyal et al.), Horovod-style per-batch
// warmup from the base LR to the scaled LR, then constant, step or cosine decay.
#pragma once

namespace dptrain::optim {

enum class LrScaling { kLinear, kNone };  // kLinear: base_lr x world_size x backward_passes_per_step
enum class Decay { kConstant, kStep, kCosine };

struct ScheduleOptions {
  double base_lr = 1e-3;
  LrScaling scaling = LrScaling::kLinear;
  int world_size = 1;
  int backward_passes_per_step = 1;
  double warmup_epochs = 0;
  Decay decay = Decay::kConstant;
  double step_size_epochs = 1;  // kStep: multiply by gamma every step_size_epochs after warmup
  double gamma = 0.1;
  double total_epochs = 1;  // kCosine: reaches min_lr here
  double min_lr = 0;
};

class LrSchedule {
 public:
  explicit LrSchedule(ScheduleOptions options);
  // The LR at fractional epoch e (epochs completed, counting partial ones: 1.5 is mid-epoch 2).
  double at(double epoch) const;
  double scaled_lr() const { return scaled_; }

 private:
  ScheduleOptions o_;
  double scaled_;
};

}  // namespace dptrain::optim
