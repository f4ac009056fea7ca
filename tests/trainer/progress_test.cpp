// Progress reporting: durations as a clock shows them, the steps a run has left (counted by hand),
// and a progress line in full, its time left worked out by hand from the epoch's pace.
#include "trainer/progress.h"

#include <gtest/gtest.h>

namespace dptrain::trainer {
namespace {

TEST(Progress, ClockText) {
  EXPECT_EQ(clock_text(0), "0:00");
  EXPECT_EQ(clock_text(7.4), "0:07");
  EXPECT_EQ(clock_text(59.6), "1:00");  // rounded to the second
  EXPECT_EQ(clock_text(754), "12:34");
  EXPECT_EQ(clock_text(3723), "1:02:03");
  EXPECT_EQ(clock_text(-3), "0:00");
}

TEST(Progress, StepsLeftInTheRun) {
  // Step 4 of 10 in epoch 1 of 3: 6 in this epoch and 2 x 10 after it.
  EXPECT_EQ(run_steps_left(10, 4, 2, 10, 0, 4), 26);
  // training.max_steps 12, 4 steps in: 8 left, however many the epochs hold.
  EXPECT_EQ(run_steps_left(10, 4, 2, 10, 12, 4), 8);
  EXPECT_EQ(run_steps_left(10, 10, 0, 10, 0, 30), 0);  // the last step of the last epoch
  EXPECT_EQ(run_steps_left(10, 4, 2, 10, 3, 4), 0);    // past max_steps (a resume with a lower one)
}

TEST(Progress, LinesShowTheTimeElapsedAndLeft) {
  Progress progress(/*enabled=*/true, ProgressMode::kLines, /*log_every_steps=*/2);
  progress.begin_epoch(1, 3, 10);
  testing::internal::CaptureStdout();
  // 4 steps in 8 s of this epoch, 26 left: 52 s at that pace.
  progress.update(3, 0.5, 0.25, 1000, -1, {.run_seconds = 10, .epoch_seconds = 8, .steps_left = 26});
  progress.update(4, 0.5, 0.25, 1000, -1, {.run_seconds = 12, .epoch_seconds = 10, .steps_left = 25});
  progress.update(5, 0.5, -1, 1000, 2.5, {.run_seconds = 3725, .epoch_seconds = 12, .steps_left = 0});
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "epoch 1/3 step 4/10 loss 0.5000 acc 25.00% 1000 samples/s, 0:10 elapsed, 0:52 left\n"
            "epoch 1/3 step 6/10 loss 0.5000 grad norm 2.5 1000 samples/s, 1:02:05 elapsed, 0:00 left\n");
}

}  // namespace
}  // namespace dptrain::trainer
