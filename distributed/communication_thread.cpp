// The communication thread: a queue of jobs, run in order on one thread.
#include "distributed/communication_thread.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/timeline.h"

namespace dptrain::distributed {
namespace {

struct Job final : PendingWork {
  std::string what;
  std::string timeline_name;
  std::function<void()> run;
  std::atomic<bool> done{false};
  std::exception_ptr error;
};

}  // namespace

struct CommunicationThread::State {
  std::mutex mutex;
  std::condition_variable has_work, finished;
  std::deque<std::shared_ptr<Job>> queue;
  bool busy = false, stop = false;
  std::thread thread;

  // The thread holds its own reference to the state, so that a detached thread never touches
  // freed memory.
  static void loop(std::shared_ptr<State> self, Guard guard) {
    timeline::set_thread(1, "communication");
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(self->mutex);
        self->has_work.wait(lock, [&] { return self->stop || !self->queue.empty(); });
        if (self->stop) return;
        job = std::move(self->queue.front());
        self->queue.pop_front();
        self->busy = true;
      }
      try {
        const auto begin = timeline::Clock::now();
        guard(job->what, job->run);
        if (timeline::enabled() && !job->timeline_name.empty())
          timeline::record(std::move(job->timeline_name), "communication", begin, timeline::Clock::now());
      } catch (...) {
        job->error = std::current_exception();
      }
      {
        std::lock_guard lock(self->mutex);
        job->done.store(true, std::memory_order_release);
        self->busy = false;
      }
      self->finished.notify_all();
    }
  }
};

CommunicationThread::CommunicationThread(Guard guard)
    : guard_(guard ? std::move(guard) : [](const std::string&, const std::function<void()>& run) { run(); }) {
}

CommunicationThread::~CommunicationThread() {
  if (!state_) return;
  bool running;
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;  // the thread starts no job after this
    running = state_->busy;
  }
  state_->has_work.notify_all();
  if (running) {
    state_->thread.detach();
  } else {
    state_->thread.join();
  }
}

bool CommunicationThread::abandon_queued(std::chrono::milliseconds grace) {
  if (!state_) return true;
  std::unique_lock lock(state_->mutex);
  state_->stop = true;
  state_->has_work.notify_all();
  return state_->finished.wait_for(lock, grace, [&] { return !state_->busy; });
}

Pending CommunicationThread::enqueue(std::string what, std::string timeline_name, std::function<void()> run) {
  if (!state_) {
    state_ = std::make_shared<State>();
    state_->thread = std::thread(State::loop, state_, guard_);
  }
  auto job = std::make_shared<Job>();
  job->what = std::move(what);
  job->timeline_name = std::move(timeline_name);
  job->run = std::move(run);
  {
    std::lock_guard lock(state_->mutex);
    state_->queue.push_back(job);
  }
  state_->has_work.notify_one();
  return Pending(std::move(job));
}

void CommunicationThread::wait(Pending& pending) {
  if (!pending.active()) return;
  const std::shared_ptr<Job> job = std::static_pointer_cast<Job>(pending.take());
  // Collectives often finish within microseconds of the request: spin a little before sleeping.
  for (int spin = 0; spin < 2000 && !job->done.load(std::memory_order_acquire); ++spin)
    std::this_thread::yield();
  if (!job->done.load(std::memory_order_acquire)) {
    std::unique_lock lock(state_->mutex);
    // Abandoned (abandon_queued) and idle, the thread runs nothing more: a job not done never will be.
    state_->finished.wait(
        lock, [&] { return job->done.load(std::memory_order_acquire) || (state_->stop && !state_->busy); });
    DPTRAIN_CHECK(job->done.load(std::memory_order_acquire), job->what,
                  ": abandoned before it ran (the communicator's owner is stopping after an error)");
  }
  if (job->error) std::rethrow_exception(job->error);
}

void CommunicationThread::drain() {
  if (!state_) return;
  std::unique_lock lock(state_->mutex);
  state_->finished.wait(lock, [&] { return !state_->busy && (state_->queue.empty() || state_->stop); });
}

}  // namespace dptrain::distributed
