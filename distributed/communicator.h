// Communicator: typed collectives over host buffers (counts are elements, carried by std::span),
// implemented with MPI. Every collective is non-blocking underneath and completes in wait(), which
// doubles as the stall watchdog: past stall_warning_s it says what it waits for, past stall_abort_s
// it throws (and main() takes every rank down).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "core/half.h"

namespace dptrain::distributed {

enum class ReduceOp { kSum, kAverage };

struct StallPolicy {
  double warning_s = 60;
  double abort_s = 0;  // 0: never abort
};

// A collective in flight. Move-only; must be waited on before its buffers are touched.
class Pending {
 public:
  Pending() = default;
  Pending(Pending&& other) noexcept;
  Pending& operator=(Pending&& other) noexcept;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending();
  bool active() const { return request_ != MPI_REQUEST_NULL; }

 private:
  friend class Communicator;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::string what_;                // for the watchdog: "allreduce of bucket 3 at step 120"
  float* average_ = nullptr;        // kAverage: divide these elements by the world size after the sum
  int64_t average_count_ = 0;
};

class Communicator {
 public:
  // Wraps `comm` (not owned); a world of one turns every collective into a no-op.
  explicit Communicator(MPI_Comm comm, StallPolicy stall = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  void set_stall_policy(StallPolicy stall) { stall_ = stall; }

  // In place. kAverage divides by size() after the sum.
  Pending start_allreduce(std::span<float> buffer, ReduceOp op, std::string what);
  // In place; the sum runs in half precision (a custom MPI_Op), callers pre-scale against overflow.
  Pending start_allreduce_half(std::span<uint16_t> buffer, HalfFormat format, std::string what);
  void wait(Pending& pending);

  // Blocking forms (start + wait).
  template <typename T>
  void allreduce(std::span<T> buffer, ReduceOp op, const std::string& what);
  template <typename T>
  void broadcast(std::span<T> buffer, int root, const std::string& what);
  // recv.size() must be send.size() * size(); rank r's elements land at [r * send.size(), ...).
  template <typename T>
  void allgather(std::span<const T> send, std::span<T> recv, const std::string& what);
  void barrier(const std::string& what);

 private:
  Pending start(MPI_Request request, std::string what);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  StallPolicy stall_;
};

}  // namespace dptrain::distributed
