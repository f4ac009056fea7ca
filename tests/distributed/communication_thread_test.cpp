// CommunicationThread: jobs run in order, errors reach wait(), and an owner unwinding from an error
// drops the jobs that have not started.
#include "distributed/communication_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"

namespace dptrain::distributed {
namespace {

TEST(CommunicationThread, RunsJobsInSubmissionOrderThroughTheGuard) {
  std::vector<int> order;
  std::vector<std::string> guarded;
  {
    CommunicationThread thread([&](const std::string& what, const std::function<void()>& run) {
      guarded.push_back(what);
      run();
    });
    std::vector<Pending> pending;
    for (int i = 0; i < 5; ++i)
      pending.push_back(thread.enqueue("job " + std::to_string(i), "", [&order, i] { order.push_back(i); }));
    thread.wait(pending[2]);
    thread.drain();
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
    thread.wait(pending[4]);  // a job that has run: returns at once
    thread.wait(pending[4]);  // taken: inactive
  }
  EXPECT_EQ(guarded, (std::vector<std::string>{"job 0", "job 1", "job 2", "job 3", "job 4"}));
}

TEST(CommunicationThread, WaitRethrowsWhatTheJobThrewAndTheThreadGoesOn) {
  CommunicationThread thread;
  Pending failing = thread.enqueue("failing", "", [] { throw std::runtime_error("the collective failed"); });
  bool ran = false;
  Pending next = thread.enqueue("next", "", [&] { ran = true; });
  EXPECT_THROW(
      {
        try {
          thread.wait(failing);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "the collective failed");
          throw;
        }
      },
      std::runtime_error);
  thread.wait(next);
  EXPECT_TRUE(ran);
}

TEST(CommunicationThread, DrainRunsEveryQueuedJob) {
  auto ran = std::make_shared<std::atomic<int>>(0);
  {
    CommunicationThread thread;
    for (int i = 0; i < 3; ++i) thread.enqueue("job", "", [ran] { ++*ran; });
    thread.drain();
  }
  EXPECT_EQ(ran->load(), 3);
}

// The owner unwinds from an error while a collective is in flight: the buffers of the queued ones are
// freed next, so those must never start. The jobs hold their flags by shared_ptr: the detached thread
// may outlive this test's frame.
TEST(CommunicationThread, DestroyedBusyItDropsTheJobsNotYetStarted) {
  auto release = std::make_shared<std::promise<void>>();
  auto released = release->get_future().share();
  auto started = std::make_shared<std::atomic<bool>>(false),
       finished = std::make_shared<std::atomic<bool>>(false),
       queued_ran = std::make_shared<std::atomic<bool>>(false);
  {
    CommunicationThread thread;
    thread.enqueue("in flight", "", [=] {
      started->store(true);
      released.wait();
      finished->store(true);
    });
    thread.enqueue("queued", "", [=] { queued_ran->store(true); });
    while (!started->load()) std::this_thread::yield();
  }
  release->set_value();
  while (!finished->load()) std::this_thread::yield();
  // Had the queued job not been dropped, it would start within microseconds of the first's end.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(queued_ran->load());
}

// An owner unwinding from an error abandons the queue before freeing the buffers (Trainer's
// destructor): the running job gets the grace, the queued ones never start, and a wait for one of
// them says so instead of hanging.
TEST(CommunicationThread, AbandonedItStartsNoQueuedJobAndAWaitForOneSaysSo) {
  auto release = std::make_shared<std::promise<void>>();
  auto released = release->get_future().share();
  auto started = std::make_shared<std::atomic<bool>>(false),
       queued_ran = std::make_shared<std::atomic<bool>>(false);
  CommunicationThread thread;
  Pending running = thread.enqueue("running", "", [=] {
    started->store(true);
    released.wait();
  });
  Pending queued = thread.enqueue("queued collective", "", [=] { queued_ran->store(true); });
  while (!started->load()) std::this_thread::yield();
  // The running job outlasts the grace: its owner must keep the job's buffers.
  EXPECT_FALSE(thread.abandon_queued(std::chrono::milliseconds(20)));
  release->set_value();
  thread.wait(running);
  try {
    thread.wait(queued);
    ADD_FAILURE() << "waiting for an abandoned job returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("queued collective: abandoned before it ran"), std::string::npos)
        << e.what();
  }
  thread.drain();  // returns: nothing will run
  EXPECT_FALSE(queued_ran->load());
}

// A job that ends within the grace, or none running: nothing touches the buffers after the call.
TEST(CommunicationThread, AbandonedItSaysWhetherAJobStillRuns) {
  CommunicationThread never_started;
  EXPECT_TRUE(never_started.abandon_queued(std::chrono::milliseconds(0)));
  CommunicationThread thread;
  auto started = std::make_shared<std::atomic<bool>>(false),
       ended = std::make_shared<std::atomic<bool>>(false);
  Pending running = thread.enqueue("running", "", [=] {
    started->store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ended->store(true);
  });
  while (!started->load()) std::this_thread::yield();
  EXPECT_TRUE(thread.abandon_queued(std::chrono::seconds(30)));
  EXPECT_TRUE(ended->load());
  thread.wait(running);
}

}  // namespace
}  // namespace dptrain::distributed
