// MPI implementation of the Communicator and its watchdog wait loop.
#include "distributed/communicator.h"

#include <cstdio>
#include <thread>
#include <type_traits>

#include "core/error.h"
#include "distributed/world.h"

namespace dptrain::distributed {
namespace {

template <typename T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  if constexpr (std::is_same_v<T, int32_t>) return MPI_INT32_T;
  if constexpr (std::is_same_v<T, int64_t>) return MPI_INT64_T;
  if constexpr (std::is_same_v<T, uint64_t>) return MPI_UINT64_T;
  if constexpr (std::is_same_v<T, uint16_t>) return MPI_UINT16_T;
  if constexpr (std::is_same_v<T, uint8_t>) return MPI_UINT8_T;
}

int checked_count(std::size_t elements) {
  DPTRAIN_CHECK(elements <= static_cast<std::size_t>(INT32_MAX), "collective of ", elements,
                " elements exceeds MPI's int count; split it");
  return static_cast<int>(elements);
}

// The half-precision sums, as MPI user operations (commutative).
void fp16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  add_halves(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len, HalfFormat::kFp16);
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  add_halves(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len, HalfFormat::kBf16);
}

MPI_Op half_sum_op(HalfFormat format) {
  // Created once per process; MPI_Finalize releases them.
  static MPI_Op ops[2] = {MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op& op = ops[format == HalfFormat::kFp16 ? 0 : 1];
  if (op == MPI_OP_NULL)
    DPTRAIN_MPI_CHECK(MPI_Op_create(format == HalfFormat::kFp16 ? fp16_sum : bf16_sum, /*commute=*/1, &op));
  return op;
}

}  // namespace

Pending::Pending(Pending&& other) noexcept { *this = std::move(other); }

Pending& Pending::operator=(Pending&& other) noexcept {
  std::swap(request_, other.request_);
  std::swap(what_, other.what_);
  std::swap(average_, other.average_);
  std::swap(average_count_, other.average_count_);
  return *this;
}

Pending::~Pending() {
  // Only reachable on error paths (an exception unwinding past a collective in flight): the job is
  // about to abort, so the request is abandoned rather than waited on.
}

Communicator::Communicator(MPI_Comm comm, StallPolicy stall) : comm_(comm), stall_(stall) {
  DPTRAIN_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DPTRAIN_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

Pending Communicator::start(MPI_Request request, std::string what) {
  Pending p;
  p.request_ = request;
  p.what_ = std::move(what);
  return p;
}

Pending Communicator::start_allreduce(std::span<float> buffer, ReduceOp op, std::string what) {
  if (size_ == 1 || buffer.empty()) return {};
  MPI_Request request;
  DPTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), checked_count(buffer.size()), MPI_FLOAT, MPI_SUM,
                                   comm_, &request));
  Pending p = start(request, std::move(what));
  if (op == ReduceOp::kAverage) {
    p.average_ = buffer.data();
    p.average_count_ = static_cast<int64_t>(buffer.size());
  }
  return p;
}

Pending Communicator::start_allreduce_half(std::span<uint16_t> buffer, HalfFormat format, std::string what) {
  if (size_ == 1 || buffer.empty()) return {};
  MPI_Request request;
  DPTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), checked_count(buffer.size()), MPI_UINT16_T,
                                   half_sum_op(format), comm_, &request));
  return start(request, std::move(what));
}

void Communicator::wait(Pending& pending) {
  if (!pending.active()) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  bool warned = false;
  int done = 0;
  for (uint64_t polls = 0;; ++polls) {
    DPTRAIN_MPI_CHECK(MPI_Test(&pending.request_, &done, MPI_STATUS_IGNORE));
    if (done) break;
    // Spin briefly (collectives usually finish in microseconds), then yield the core to the peers
    // that share it, and look at the clock only now and then.
    if (polls < 1000 || polls % 64 != 0) continue;
    std::this_thread::yield();
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (!warned && waited > stall_.warning_s) {
      std::fprintf(stderr, "dptrain: rank %d has waited %.0f s in %s; a peer may be stalled or dead\n", rank_,
                   waited, pending.what_.c_str());
      std::fflush(stderr);
      warned = true;
    }
    DPTRAIN_CHECK(stall_.abort_s <= 0 || waited <= stall_.abort_s, "stalled ", waited, " s in ", pending.what_,
                  " on rank ", rank_, " (distributed.stall_abort_s = ", stall_.abort_s,
                  "); check the other ranks' logs for the first error");
  }
  pending.request_ = MPI_REQUEST_NULL;
  if (pending.average_) {
    const float inv = 1.0f / static_cast<float>(size_);
    for (int64_t i = 0; i < pending.average_count_; ++i) pending.average_[i] *= inv;
    pending.average_ = nullptr;
  }
}

template <typename T>
void Communicator::allreduce(std::span<T> buffer, ReduceOp op, const std::string& what) {
  if (size_ == 1 || buffer.empty()) return;
  MPI_Request request;
  DPTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), checked_count(buffer.size()), mpi_type<T>(),
                                   MPI_SUM, comm_, &request));
  Pending p = start(request, what);
  wait(p);
  if (op == ReduceOp::kAverage)
    for (T& v : buffer) v /= static_cast<T>(size_);
}

template <typename T>
void Communicator::broadcast(std::span<T> buffer, int root, const std::string& what) {
  if (size_ == 1 || buffer.empty()) return;
  MPI_Request request;
  DPTRAIN_MPI_CHECK(MPI_Ibcast(buffer.data(), checked_count(buffer.size()), mpi_type<T>(), root, comm_, &request));
  Pending p = start(request, what);
  wait(p);
}

template <typename T>
void Communicator::allgather(std::span<const T> send, std::span<T> recv, const std::string& what) {
  DPTRAIN_CHECK(recv.size() == send.size() * static_cast<std::size_t>(size_), "allgather: receive buffer of ",
                recv.size(), " elements for ", send.size(), " x ", size_, " ranks");
  if (size_ == 1) {
    std::copy(send.begin(), send.end(), recv.begin());
    return;
  }
  MPI_Request request;
  DPTRAIN_MPI_CHECK(MPI_Iallgather(send.data(), checked_count(send.size()), mpi_type<T>(), recv.data(),
                                   checked_count(send.size()), mpi_type<T>(), comm_, &request));
  Pending p = start(request, what);
  wait(p);
}

void Communicator::barrier(const std::string& what) {
  if (size_ == 1) return;
  MPI_Request request;
  DPTRAIN_MPI_CHECK(MPI_Ibarrier(comm_, &request));
  Pending p = start(request, what);
  wait(p);
}

#define DPTRAIN_INSTANTIATE(T)                                                             \
  template void Communicator::allreduce<T>(std::span<T>, ReduceOp, const std::string&);   \
  template void Communicator::broadcast<T>(std::span<T>, int, const std::string&);         \
  template void Communicator::allgather<T>(std::span<const T>, std::span<T>, const std::string&);
DPTRAIN_INSTANTIATE(float)
DPTRAIN_INSTANTIATE(double)
DPTRAIN_INSTANTIATE(int32_t)
DPTRAIN_INSTANTIATE(int64_t)
DPTRAIN_INSTANTIATE(uint64_t)
DPTRAIN_INSTANTIATE(uint16_t)
DPTRAIN_INSTANTIATE(uint8_t)
#undef DPTRAIN_INSTANTIATE

}  // namespace dptrain::distributed
