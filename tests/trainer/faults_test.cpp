// DPTRAIN_INJECT_FAULT (trainer/faults.h): which values are refused, and when the slow kind sleeps.
#include "trainer/faults.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>

#include "core/error.h"

namespace dptrain::trainer {
namespace {

// The variable set for one test and removed after it, so that no other test in this process sees it.
class FaultVariable {
 public:
  explicit FaultVariable(const std::string& value) { ::setenv("DPTRAIN_INJECT_FAULT", value.c_str(), 1); }
  ~FaultVariable() { ::unsetenv("DPTRAIN_INJECT_FAULT"); }
};

double milliseconds_of(const InjectedFault& fault, int rank, int64_t steps_done) {
  const auto began = std::chrono::steady_clock::now();
  fault.before_step(rank, steps_done);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
}

TEST(InjectedFault, MalformedValuesAreRefusedNamingTheVariableAndTheForm) {
  for (const char* value : {"x", "0", "0:5:explode", "-1:5", "0:-2", "0:5:slow", "0:5:slow:", "0:5:slow:0",
                            "0:5:slow:-3", "0:5:slow:20ms", "0:5:slow:60001"}) {
    const FaultVariable variable(value);
    try {
      InjectedFault::from_environment();
      ADD_FAILURE() << "accepted DPTRAIN_INJECT_FAULT='" << value << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("DPTRAIN_INJECT_FAULT='") + value + "'"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("slow:MS"), std::string::npos) << e.what();
    }
  }
}

TEST(InjectedFault, UnsetItDoesNothing) {
  ::unsetenv("DPTRAIN_INJECT_FAULT");
  const InjectedFault none = InjectedFault::from_environment();
  for (int64_t step = 0; step < 4; ++step) EXPECT_NO_THROW(none.before_step(0, step));
  EXPECT_FALSE(none.kills_checkpoint(0, 0));
}

TEST(InjectedFault, ThrowIsTheDefaultKindAndFiresOnlyAtItsRankAndStep) {
  const FaultVariable variable("1:3");
  const InjectedFault fault = InjectedFault::from_environment();
  EXPECT_NO_THROW(fault.before_step(1, 2));
  EXPECT_NO_THROW(fault.before_step(0, 3));
  EXPECT_THROW(fault.before_step(1, 3), Error);
  EXPECT_NO_THROW(fault.before_step(1, 4));
}

// Lower bounds on the sleeps (which no load can break) and generous upper bounds on the calls that
// must not sleep (half the sleep: a call that returns at once would have to be descheduled that long).
TEST(InjectedFault, SlowSleepsOnItsRankBeforeItsStepAndEveryLaterOne) {
  constexpr double kSleepMs = 400;
  const FaultVariable variable("1:3:slow:400");
  const InjectedFault fault = InjectedFault::from_environment();
  EXPECT_LT(milliseconds_of(fault, 1, 2), kSleepMs / 2) << "slept before its step";
  EXPECT_LT(milliseconds_of(fault, 0, 3), kSleepMs / 2) << "slept on another rank";
  EXPECT_GE(milliseconds_of(fault, 1, 3), kSleepMs);
  EXPECT_GE(milliseconds_of(fault, 1, 9), kSleepMs);
  EXPECT_FALSE(fault.kills_checkpoint(1, 3));
}

}  // namespace
}  // namespace dptrain::trainer
