// Threads per rank: configured, from Slurm's SLURM_CPUS_PER_TASK, or the host's cores by hand, within
// the CPUs the process is bound to (sched_setaffinity here).
#include "trainer/threads.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace dptrain::trainer {
namespace {

TEST(ThreadsPerRank, TheConfigWinsOverSlurmAndTheHost) {
  EXPECT_EQ(threads_per_rank(3, "8", 16, 2, 16), 3);
}

TEST(ThreadsPerRank, SlurmsCpusPerTaskWhenTheConfigLeavesIt) {
  // 16 cores and 2 ranks here would give 8 each; the job was given 4 per task.
  EXPECT_EQ(threads_per_rank(0, "4", 16, 2, 16), 4);
  EXPECT_EQ(threads_per_rank(0, "1", 16, 1, 16), 1);
}

TEST(ThreadsPerRank, TheHostsCoresSharedAmongItsRanksOtherwise) {
  EXPECT_EQ(threads_per_rank(0, nullptr, 16, 2, 16), 8);
  EXPECT_EQ(threads_per_rank(0, nullptr, 16, 3, 16), 5);  // 16 / 3 rounded down
  EXPECT_EQ(threads_per_rank(0, nullptr, 2, 4, 16), 1);   // oversubscribed: one each, never zero
}

TEST(ThreadsPerRank, AMalformedSlurmValueIsPassedOver) {
  for (const char* value : {"", "0", "-2", "4x", "x", "2(x3)"}) {
    EXPECT_EQ(threads_per_rank(0, value, 16, 2, 16), 8) << "SLURM_CPUS_PER_TASK=\"" << value << "\"";
  }
}

TEST(ThreadsPerRank, NoMoreThanTheCpusTheProcessIsBoundTo) {
  // mpirun -np 1 on a 2-core host: one rank bound to one core.
  EXPECT_EQ(threads_per_rank(0, nullptr, 2, 1, 1), 1);
  EXPECT_EQ(threads_per_rank(0, nullptr, 16, 2, 4), 4);   // --map-by socket:PE=4
  EXPECT_EQ(threads_per_rank(0, nullptr, 16, 2, 16), 8);  // --bind-to none
  EXPECT_EQ(threads_per_rank(0, "8", 16, 2, 2), 2);
  EXPECT_EQ(threads_per_rank(0, nullptr, 16, 2, 0), 1);  // never zero
  EXPECT_EQ(threads_per_rank(3, nullptr, 16, 1, 1), 3);  // the config still wins (the trainer warns)
}

TEST(ThreadsPerRank, TheAffinityMaskIsCounted) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  const int first = [&] {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &before)) return cpu;
    return -1;
  }();
  ASSERT_GE(first, 0);
  EXPECT_EQ(allowed_cpus_of_this_process(), CPU_COUNT(&before));
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(allowed_cpus_of_this_process(), 1);
  EXPECT_EQ(threads_for_this_process(0, 1), 1);
  EXPECT_EQ(threads_for_this_process(5, 1), 5);
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
}

}  // namespace
}  // namespace dptrain::trainer
