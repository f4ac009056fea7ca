// Communicator: typed collectives over host buffers (counts are elements, carried by std::span),
// implemented with MPI's blocking collectives, which Open MPI tunes far better than their
// non-blocking forms (MPI_Iallreduce measured 5x slower at 4 KiB here, and it only progresses when
// polled). Asynchrony comes from a communication thread instead: start_* queues a collective that
// runs there, in submission order, while the caller computes (Horovod's design). A watchdog thread
// sees every collective in flight: past stall_warning_s it says what is waited for; past
// stall_abort_s it ends the process, and mpirun takes the other ranks down.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/half.h"

namespace dptrain::distributed {

enum class ReduceOp { kSum, kAverage };

struct StallPolicy {
  double warning_s = 60;  // 0: never warn
  double abort_s = 0;     // 0: never abort
};

struct Job;
struct CommWorker;
struct StallWatchdog;

// A collective queued on the communication thread; wait() before touching its buffer.
class Pending {
 public:
  bool active() const { return job_ != nullptr; }

 private:
  friend class Communicator;
  std::shared_ptr<Job> job_;
};

class Communicator {
 public:
  // Wraps `comm` (not owned); a world of one turns every collective into a no-op.
  explicit Communicator(MPI_Comm comm, StallPolicy stall = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Asynchronous, in place, run on the communication thread in submission order. `what` names the
  // collective in errors and stall warnings; `timeline_name`, if given, is its span on the timeline.
  Pending start_allreduce(std::span<float> buffer, ReduceOp op, std::string what,
                          std::string timeline_name = {});
  // The sum runs in half precision (a custom MPI_Op); callers pre-scale against overflow.
  Pending start_allreduce_half(std::span<uint16_t> buffer, HalfFormat format, std::string what,
                               std::string timeline_name = {});
  // Rethrows the collective's error, if any.
  void wait(Pending& pending);

  // Synchronous, on the calling thread (after the communication thread has drained).
  template <typename T>
  void allreduce(std::span<T> buffer, ReduceOp op, const std::string& what);
  void allreduce_half(std::span<uint16_t> buffer, HalfFormat format, const std::string& what);
  template <typename T>
  void broadcast(std::span<T> buffer, int root, const std::string& what);
  // recv.size() must be send.size() * size(); rank r's elements land at [r * send.size(), ...).
  template <typename T>
  void allgather(std::span<const T> send, std::span<T> recv, const std::string& what);
  void barrier(const std::string& what);
  // Every rank's string on rank 0 (in rank order); other ranks get an empty list.
  std::vector<std::string> gather_to_root(const std::string& mine, const std::string& what);

 private:
  Pending submit(std::string what, std::string timeline_name, std::function<void()> run);
  void drain();

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<StallWatchdog> watchdog_;
  std::shared_ptr<CommWorker> worker_;  // started on the first asynchronous collective
};

}  // namespace dptrain::distributed
