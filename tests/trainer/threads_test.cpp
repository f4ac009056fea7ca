// Threads per rank: configured, from Slurm's SLURM_CPUS_PER_TASK, or the host's cores by hand.
#include "trainer/threads.h"

#include <gtest/gtest.h>

namespace dptrain::trainer {
namespace {

TEST(ThreadsPerRank, TheConfigWinsOverSlurmAndTheHost) {
  EXPECT_EQ(threads_per_rank(3, "8", 16, 2), 3);
}

TEST(ThreadsPerRank, SlurmsCpusPerTaskWhenTheConfigLeavesIt) {
  // 16 cores and 2 ranks here would give 8 each; the job was given 4 per task.
  EXPECT_EQ(threads_per_rank(0, "4", 16, 2), 4);
  EXPECT_EQ(threads_per_rank(0, "1", 16, 1), 1);
}

TEST(ThreadsPerRank, TheHostsCoresSharedAmongItsRanksOtherwise) {
  EXPECT_EQ(threads_per_rank(0, nullptr, 16, 2), 8);
  EXPECT_EQ(threads_per_rank(0, nullptr, 16, 3), 5);  // 16 / 3 rounded down
  EXPECT_EQ(threads_per_rank(0, nullptr, 2, 4), 1);   // oversubscribed: one each, never zero
}

TEST(ThreadsPerRank, AMalformedSlurmValueIsPassedOver) {
  for (const char* value : {"", "0", "-2", "4x", "x", "2(x3)"}) {
    EXPECT_EQ(threads_per_rank(0, value, 16, 2), 8) << "SLURM_CPUS_PER_TASK=\"" << value << "\"";
  }
}

}  // namespace
}  // namespace dptrain::trainer
