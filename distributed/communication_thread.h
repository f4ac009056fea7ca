// CommunicationThread: one thread that runs a communicator's collectives in submission order.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "distributed/communicator.h"

namespace dptrain::distributed {

// The asynchronous half of MpiCommunicator: MPI's blocking collectives queued here run one at a time
// on a thread of their own (started by the first), in submission order, while the caller computes
// (Horovod's design).
class CommunicationThread {
 public:
  // Runs a job: `guard` may wrap it (the stall watchdog's watch).
  using Guard = std::function<void(const std::string& what, const std::function<void()>& run)>;
  explicit CommunicationThread(Guard guard = {});
  // Starts no job after this one; jobs still queued are dropped. Joins the thread when it is not
  // running a job. Running one, the owner is unwinding from an error with a collective that may
  // never return, and an abort is coming: the thread is left to end it on its own. Either way the
  // ranks may now disagree on which collectives ran: no collective may follow.
  ~CommunicationThread();
  CommunicationThread(const CommunicationThread&) = delete;
  CommunicationThread& operator=(const CommunicationThread&) = delete;

  // Queues `run`; `timeline_name`, when not empty, names its span on the timeline.
  Pending enqueue(std::string what, std::string timeline_name, std::function<void()> run);
  // Waits for the job; rethrows what it threw.
  void wait(Pending& pending);
  // Waits until every job queued so far has run.
  void drain();
  // Communicator::abandon_queued: no queued job starts from here on; waits up to `grace` for the one
  // running, if any. False when it is still running.
  bool abandon_queued(std::chrono::milliseconds grace);

 private:
  struct State;
  Guard guard_;
  std::shared_ptr<State> state_;  // shared with the thread, which may outlive this object
};

}  // namespace dptrain::distributed
