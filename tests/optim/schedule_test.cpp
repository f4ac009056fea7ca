// LrSchedule against formulas written out here: linear scaling (Goyal et al.: lr x world size x
// backward passes per step), Horovod's per-batch warmup from the scaled lr / ranks to the scaled lr,
// and step and cosine decay after the warmup.
#include "optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace dptrain::optim {
namespace {

constexpr double kRel = 1e-12;

ScheduleOptions options(double lr, LrScaling scaling, int size, int passes = 1) {
  ScheduleOptions o;
  o.base_lr = lr;
  o.scaling = scaling;
  o.world_size = size;
  o.backward_passes_per_step = passes;
  return o;
}

// Horovod's LearningRateWarmupCallback (horovod/_keras/callbacks.py): at fractional epoch e < w,
//   lr(e) = initial_lr / size * (e * (size - 1) / w + 1),
// with initial_lr the already scaled LR; it starts at initial_lr / size and reaches initial_lr at w.
double horovod_warmup(double lr_scaled, int size, double w, double e) {
  return lr_scaled / size * ((size - 1) / w * e + 1);
}

TEST(lr_schedule, LinearScalingMultipliesByWorldSizeAndPasses) {
  for (int size : {1, 2, 4, 8})
    for (int passes : {1, 3}) {
      const LrSchedule s(options(0.0125, LrScaling::kLinear, size, passes));
      EXPECT_NEAR(s.scaled_lr(), 0.0125 * size * passes, kRel) << size << " ranks, " << passes << " passes";
      for (double e : {0.0, 0.3, 1.0, 7.25}) EXPECT_NEAR(s.at(e), 0.0125 * size * passes, kRel);
    }
}

TEST(lr_schedule, NoScalingKeepsTheBaseLr) {
  const LrSchedule s(options(0.05, LrScaling::kNone, 8, 2));
  EXPECT_DOUBLE_EQ(s.scaled_lr(), 0.05);
  for (double e : {0.0, 0.5, 3.0}) EXPECT_DOUBLE_EQ(s.at(e), 0.05);
}

TEST(lr_schedule, WarmupFollowsHorovodsFormula) {
  for (int size : {1, 2, 4, 8})
    for (double w : {0.5, 1.0, 5.0}) {
      ScheduleOptions o = options(0.1, LrScaling::kLinear, size);
      o.warmup_epochs = w;
      const LrSchedule s(o);
      const double scaled = 0.1 * size;
      for (double f : {0.0, 0.01, 0.25, 0.5, 0.77, 0.999}) {
        const double e = f * w;
        EXPECT_NEAR(s.at(e), horovod_warmup(scaled, size, w, e), kRel * scaled)
            << size << " ranks, w " << w << ", e " << e;
      }
      // From the unscaled lr at the start to the scaled lr at the end of the warmup, then constant.
      EXPECT_NEAR(s.at(0), 0.1, kRel);
      EXPECT_NEAR(s.at(w), scaled, kRel);
      EXPECT_NEAR(s.at(w + 0.5), scaled, kRel);
      // Monotone in between.
      for (double e = 0; e + 0.01 < w; e += 0.01) EXPECT_LE(s.at(e), s.at(e + 0.01)) << e;
    }
}

// Per batch: the trainer asks at epoch + batch / batches_per_epoch. With 4 ranks, w = 2 and 10
// batches per epoch, batch 3 of epoch 2 (e = 1.3) gets 0.4 / 4 * (3 / 2 * 1.3 + 1) = 0.295.
TEST(lr_schedule, WarmupPerBatchWorkedExample) {
  ScheduleOptions o = options(0.1, LrScaling::kLinear, 4);
  o.warmup_epochs = 2;
  EXPECT_NEAR(LrSchedule(o).at(1 + 3.0 / 10), 0.295, 1e-12);
}

TEST(lr_schedule, WarmupWithoutScalingStartsAtLrOverSize) {
  ScheduleOptions o = options(0.2, LrScaling::kNone, 4);
  o.warmup_epochs = 1;
  const LrSchedule s(o);
  EXPECT_NEAR(s.at(0), 0.05, kRel);
  EXPECT_NEAR(s.at(0.5), horovod_warmup(0.2, 4, 1, 0.5), kRel);
  EXPECT_NEAR(s.at(1), 0.2, kRel);
}

TEST(lr_schedule, StepDecayMultipliesByGammaEveryStepSizeAfterWarmup) {
  ScheduleOptions o = options(0.1, LrScaling::kLinear, 2);
  o.warmup_epochs = 1;
  o.decay = Decay::kStep;
  o.step_size_epochs = 3;
  o.gamma = 0.5;
  const LrSchedule s(o);
  const double scaled = 0.2;
  EXPECT_NEAR(s.at(1.0), scaled, kRel);  // warmup over, first step of decay not yet
  EXPECT_NEAR(s.at(3.99), scaled, kRel);
  EXPECT_NEAR(s.at(4.0), scaled * 0.5, kRel);  // 3 epochs after the warmup
  EXPECT_NEAR(s.at(6.5), scaled * 0.5, kRel);
  EXPECT_NEAR(s.at(7.0), scaled * 0.25, kRel);
  EXPECT_NEAR(s.at(10.2), scaled * 0.125, kRel);
  EXPECT_NEAR(s.at(0.5), horovod_warmup(scaled, 2, 1, 0.5), kRel);  // warmup first
}

// The trainer asks at epoch - 1 + samples / dataset size, and a boundary may come out a rounding short:
// with 60000 samples and warmup 0.4, sample 24000 of epoch 2 is 1.4, and 1.4 - 0.4 is
// 0.9999999999999999; 0.3 / 0.1 is 2.9999999999999996. The decay still comes at that sample, and not
// one sample earlier.
TEST(lr_schedule, StepDecayAtBoundariesThatRoundShort) {
  ScheduleOptions o = options(0.1, LrScaling::kNone, 1);
  o.decay = Decay::kStep;
  o.gamma = 0.1;
  o.warmup_epochs = 0.4;
  const double at_boundary = 1 + 24000.0 / 60000, sample_before = 1 + 23999.0 / 60000;
  ASSERT_LT(at_boundary - 0.4, 1.0) << "the example no longer rounds short";
  EXPECT_NEAR(LrSchedule(o).at(at_boundary), 0.01, kRel);
  EXPECT_NEAR(LrSchedule(o).at(sample_before), 0.1, kRel);
  o.warmup_epochs = 0;
  o.step_size_epochs = 0.1;
  ASSERT_LT(0.3 / 0.1, 3.0);
  EXPECT_NEAR(LrSchedule(o).at(0.3), 0.1 * 1e-3, kRel);
  EXPECT_NEAR(LrSchedule(o).at(0.3 - 1.0 / 60000), 0.1 * 1e-2, kRel);
}

TEST(lr_schedule, CosineFromScaledLrToMinLrOverTheEpochsAfterWarmup) {
  for (double w : {0.0, 2.0}) {
    ScheduleOptions o = options(0.01, LrScaling::kLinear, 4);
    o.warmup_epochs = w;
    o.decay = Decay::kCosine;
    o.total_epochs = 10;
    o.min_lr = 0.001;
    const LrSchedule s(o);
    const double scaled = 0.04;
    const double mid = w + (10 - w) / 2;
    EXPECT_NEAR(s.at(w), scaled, kRel) << "w " << w;
    EXPECT_NEAR(s.at(mid), (scaled + 0.001) / 2, kRel) << "w " << w;
    EXPECT_NEAR(s.at(10), 0.001, kRel) << "w " << w;
    EXPECT_NEAR(s.at(12), 0.001, kRel) << "w " << w;  // stays at min_lr past the end
    // A quarter of the way: min + (scaled - min) (1 + cos(pi / 4)) / 2.
    const double quarter = w + (10 - w) / 4;
    EXPECT_NEAR(s.at(quarter), 0.001 + (scaled - 0.001) * (1 + std::cos(std::numbers::pi / 4)) / 2, kRel);
  }
}

// (Unknown names are the config's to reject: tests/trainer/config_test.cpp.)
TEST(lr_schedule, RejectsABadStepSize) {
  ScheduleOptions o = options(0.1, LrScaling::kLinear, 2);
  o.decay = Decay::kStep;
  o.step_size_epochs = 0;
  EXPECT_THROW(LrSchedule{o}, Error);
}

}  // namespace
}  // namespace dptrain::optim
