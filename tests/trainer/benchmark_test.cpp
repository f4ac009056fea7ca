// The benchmarks' median (trainer/run_types.h) against medians worked out by hand: odd and even
// counts, unsorted input, none.
#include <gtest/gtest.h>

#include <vector>

#include "trainer/run_types.h"

namespace dptrain::trainer {
namespace {

TEST(BenchmarkMedian, MiddleValueOrMeanOfTheMiddleTwo) {
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({7.0}), 7.0);
  EXPECT_DOUBLE_EQ(median({31.7, 47.1}), 39.4);  // two timed iterations: their mean, not the faster one
  EXPECT_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_EQ(median({5.0, 5.0, 1.0, 9.0, 5.0}), 5.0);
}

}  // namespace
}  // namespace dptrain::trainer
