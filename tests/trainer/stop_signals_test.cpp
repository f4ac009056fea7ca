// Stop requests: a signal is recorded (the first one wins), counted per rank and described; a
// second SIGINT ends the process at once with status 130. The end-to-end behaviour under mpirun
// (the agreed step, the checkpoint, status 75, the exact resume) is tests/trainer/signals_e2e.sh.
#include "trainer/stop_signals.h"

#include <gtest/gtest.h>

#include <csignal>

namespace dptrain::trainer {
namespace {

class StopSignals : public ::testing::Test {
 protected:
  void SetUp() override {
    install_stop_handlers();
    clear_stop_signal();
  }
  void TearDown() override {
    clear_stop_signal();
    for (const int s : {SIGTERM, SIGINT, SIGUSR1}) std::signal(s, SIG_DFL);
  }
};

TEST_F(StopSignals, EachSignalIsRecordedAndTheFirstWins) {
  EXPECT_EQ(received_stop_signal(), 0);
  EXPECT_FALSE(StopRequests::of_this_process().any());
  std::raise(SIGUSR1);
  EXPECT_EQ(received_stop_signal(), SIGUSR1);
  std::raise(SIGTERM);  // a later signal does not replace the first
  EXPECT_EQ(received_stop_signal(), SIGUSR1);
  const StopRequests r = StopRequests::of_this_process();
  EXPECT_EQ(r.sigusr1, 1);
  EXPECT_EQ(r.sigterm + r.sigint, 0);
  clear_stop_signal();
  std::raise(SIGTERM);
  EXPECT_EQ(StopRequests::of_this_process().sigterm, 1);
}

TEST_F(StopSignals, RequestsSummedOverRanksAreDescribed) {
  EXPECT_EQ((StopRequests{.sigterm = 1}).describe(), "SIGTERM on 1 rank");
  EXPECT_EQ((StopRequests{.sigterm = 1, .sigusr1 = 3}).describe(),
            "SIGTERM on 1 rank and SIGUSR1 on 3 ranks");
  EXPECT_TRUE((StopRequests{.sigint = 2}).any());
  EXPECT_FALSE(StopRequests{}.any());
}

TEST_F(StopSignals, FirstSigintRequestsAStopTheSecondExitsAt130) {
  std::raise(SIGINT);
  EXPECT_EQ(received_stop_signal(), SIGINT);
  EXPECT_EXIT(std::raise(SIGINT), ::testing::ExitedWithCode(kExitInterrupted),
              "second SIGINT: stopping at once");
}

}  // namespace
}  // namespace dptrain::trainer
