// Communicator: the collectives the trainer needs, as an interface with typed helpers (counts are
// elements, carried by std::span; the element type picks the wire type). Implementations: MPI over
// host memory (distributed/mpi_communicator.h) and NCCL over device memory (cuda/). Buffers live in
// memory the communicator accepts(); collectives that start asynchronously complete in submission
// order, and a buffer may be touched again only after wait().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/half.h"
#include "core/storage.h"

namespace dptrain::distributed {

// kMax: of integers and fp32/fp64 only (flags agreed across ranks).
enum class ReduceOp { kSum, kAverage, kMax };

enum class DataType { kF32, kF64, kI32, kI64, kU64, kU16, kU8, kF16, kBf16 };

template <typename T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>) return DataType::kF32;
  if constexpr (std::is_same_v<T, double>) return DataType::kF64;
  if constexpr (std::is_same_v<T, int32_t>) return DataType::kI32;
  if constexpr (std::is_same_v<T, int64_t>) return DataType::kI64;
  if constexpr (std::is_same_v<T, uint64_t>) return DataType::kU64;
  if constexpr (std::is_same_v<T, uint16_t>) return DataType::kU16;
  if constexpr (std::is_same_v<T, uint8_t>) return DataType::kU8;
}

inline DataType half_type(HalfFormat format) {
  return format == HalfFormat::kFp16 ? DataType::kF16 : DataType::kBf16;
}

constexpr std::size_t element_size(DataType type) {
  switch (type) {
    case DataType::kF64:
    case DataType::kI64:
    case DataType::kU64:
      return 8;
    case DataType::kF32:
    case DataType::kI32:
      return 4;
    case DataType::kU16:
    case DataType::kF16:
    case DataType::kBf16:
      return 2;
    case DataType::kU8:
      return 1;
  }
  return 0;
}

struct StallPolicy {
  double warning_s = 60;  // 0: never warn
  double abort_s = 0;     // 0: never abort
};

// A collective in flight; wait() on it before touching its buffer. Implementations keep their state
// in a PendingWork of their own.
struct PendingWork {
  virtual ~PendingWork() = default;
};
class Pending {
 public:
  Pending() = default;
  explicit Pending(std::shared_ptr<PendingWork> work) : work_(std::move(work)) {}
  bool active() const { return work_ != nullptr; }
  std::shared_ptr<PendingWork> take() { return std::move(work_); }

 private:
  std::shared_ptr<PendingWork> work_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether collectives may read and write buffers in `device`'s memory.
  virtual bool accepts(Device device) const = 0;
  // `bytes` of `device` memory for a buffer that will be reduced again and again (the gradients):
  // memory this communicator reduces best in. The MPI communicator of ranks that share one host puts
  // it in shared memory and reduces it there without copies (distributed/shared_memory_reduce.h).
  // Collective: every rank calls it, in the same order, with the same size.
  virtual StoragePtr allocate_reduction_buffer(std::size_t bytes, Device device) {
    return make_storage(bytes, device);
  }
  // Whether collectives on `data` (from allocate_reduction_buffer) run in shared memory.
  virtual bool reduces_in_shared_memory(const void* /*data*/) const { return false; }
  // An fp32 sum in place, as start_allreduce with ReduceOp::kSum, that also finds out whether every
  // element of the result is finite, where the implementation can tell without another pass over the
  // result: in shared memory each rank tests its chunk while the sums are still in registers (a
  // separate pass would read back the lines the peers just wrote, from their cores' caches). Sets
  // *finite when wait() on the returned Pending returns, or, `synchronous`, before the call returns
  // (the Pending is then inactive). Nullopt, with nothing started, where the implementation cannot
  // tell: the caller reduces and tests the result itself.
  virtual std::optional<Pending> start_sum_testing_finite(std::span<float> /*buffer*/, bool* /*finite*/,
                                                          std::string /*what*/, std::string /*timeline_name*/,
                                                          bool /*synchronous*/) {
    return std::nullopt;
  }

  // Asynchronous, in place. `what` names the collective in errors and stall warnings;
  // `timeline_name`, if given, is its span on the timeline.
  template <typename T>
  Pending start_allreduce(std::span<T> buffer, ReduceOp op, std::string what,
                          std::string timeline_name = {}) {
    return start_allreduce_elements(buffer.data(), buffer.size(), data_type_of<T>(), op, std::move(what),
                                    std::move(timeline_name));
  }
  // The sum runs in half precision; callers pre-scale against overflow.
  Pending start_allreduce_half(std::span<uint16_t> buffer, HalfFormat format, std::string what,
                               std::string timeline_name = {}) {
    return start_allreduce_elements(buffer.data(), buffer.size(), half_type(format), ReduceOp::kSum,
                                    std::move(what), std::move(timeline_name));
  }
  // Reduce-scatter, in place: `buffer` is size() equal chunks; once it completes, chunk rank() holds
  // that chunk's sum (or average) over the ranks, and the other chunks are undefined. Followed by
  // start_allgather_in_place, the same result and the same bytes on the wire as an allreduce, with
  // the work in between done on one chunk per rank (ZeRO's sharded optimizer step).
  template <typename T>
  Pending start_reduce_scatter(std::span<T> buffer, ReduceOp op, std::string what,
                               std::string timeline_name = {}) {
    const std::size_t chunk = chunk_of(buffer.size(), "reduce-scatter", what);
    return start_reduce_scatter_elements(buffer.data(), chunk, data_type_of<T>(), op, std::move(what),
                                         std::move(timeline_name));
  }
  // The sum runs in half precision; callers pre-scale against overflow.
  Pending start_reduce_scatter_half(std::span<uint16_t> buffer, HalfFormat format, std::string what,
                                    std::string timeline_name = {}) {
    const std::size_t chunk = chunk_of(buffer.size(), "reduce-scatter", what);
    return start_reduce_scatter_elements(buffer.data(), chunk, half_type(format), ReduceOp::kSum,
                                         std::move(what), std::move(timeline_name));
  }
  // All-gather, in place: chunk r of `buffer` (size() equal chunks) is rank r's, on every rank.
  template <typename T>
  Pending start_allgather_in_place(std::span<T> buffer, std::string what, std::string timeline_name = {}) {
    const std::size_t chunk = chunk_of(buffer.size(), "allgather", what);
    return start_allgather_in_place_elements(buffer.data(), chunk, data_type_of<T>(), std::move(what),
                                             std::move(timeline_name));
  }
  // Rethrows the collective's error, if any.
  virtual void wait(Pending& pending) = 0;
  // For an owner unwinding from an error, before it frees the buffers of collectives it started and
  // did not wait for: none of them that is still queued starts from here on, and one running is
  // given up to `grace` to end (its peers may never join it: an abort is coming). No collective may
  // follow; the process is to abort. False when one is still running after the grace: its buffers
  // must then stay allocated until the abort (a late peer would complete it into them).
  virtual bool abandon_queued(std::chrono::milliseconds /*grace*/) { return true; }

  // Synchronous, after every asynchronous collective submitted before has completed.
  template <typename T>
  void allreduce(std::span<T> buffer, ReduceOp op, const std::string& what) {
    allreduce_elements(buffer.data(), buffer.size(), data_type_of<T>(), op, what);
  }
  void allreduce_half(std::span<uint16_t> buffer, HalfFormat format, const std::string& what) {
    allreduce_elements(buffer.data(), buffer.size(), half_type(format), ReduceOp::kSum, what);
  }
  template <typename T>
  void broadcast(std::span<T> buffer, int root, const std::string& what) {
    broadcast_elements(buffer.data(), buffer.size(), data_type_of<T>(), root, what);
  }
  // recv.size() must be send.size() * size(); rank r's elements land at [r * send.size(), ...).
  template <typename T>
  void allgather(std::span<const T> send, std::span<T> recv, const std::string& what) {
    check_allgather_sizes(send.size(), recv.size());
    allgather_elements(send.data(), recv.data(), send.size(), data_type_of<T>(), what);
  }
  // Rank r's `send` to [r * send.size(), (r + 1) * send.size()) of `recv` on `root`, where recv.size()
  // must be send.size() * size() (elsewhere `recv` is not touched; `send` and `recv` do not overlap):
  // state that differs by rank, to the rank that writes the checkpoint. The root's size is checked
  // on the root alone: every rank must pass the same count.
  template <typename T>
  void gather(std::span<const T> send, std::span<T> recv, int root, const std::string& what) {
    check_rooted_sizes("gather", send.size(), recv.size(), root, what);
    gather_elements(send.data(), recv.data(), send.size(), data_type_of<T>(), root, what);
  }
  // The inverse: chunk r of root's `send` (send.size() == recv.size() * size() there; unused
  // elsewhere) to rank r's `recv`.
  template <typename T>
  void scatter(std::span<const T> send, std::span<T> recv, int root, const std::string& what) {
    check_rooted_sizes("scatter", recv.size(), send.size(), root, what);
    scatter_elements(send.data(), recv.data(), recv.size(), data_type_of<T>(), root, what);
  }
  template <typename T>
  void reduce_scatter(std::span<T> buffer, ReduceOp op, const std::string& what) {
    Pending pending = start_reduce_scatter(buffer, op, what);
    wait(pending);
  }
  template <typename T>
  void allgather_in_place(std::span<T> buffer, const std::string& what) {
    Pending pending = start_allgather_in_place(buffer, what);
    wait(pending);
  }
  virtual void barrier(const std::string& what) = 0;
  // Every rank's string on rank 0 (in rank order); other ranks get an empty list.
  virtual std::vector<std::string> gather_to_root(const std::string& mine, const std::string& what) = 0;

  // The untyped collectives behind the typed helpers, `count` elements of `type`: what an
  // implementation provides (and what a communicator that wraps another calls). Use the typed forms.
  virtual Pending start_allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                                           std::string what, std::string timeline_name) = 0;
  virtual void allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                                  const std::string& what) = 0;
  virtual void broadcast_elements(void* data, std::size_t count, DataType type, int root,
                                  const std::string& what) = 0;
  virtual void allgather_elements(const void* send, void* recv, std::size_t count, DataType type,
                                  const std::string& what) = 0;
  // `chunk` elements per rank: the buffers hold size() * chunk.
  virtual Pending start_reduce_scatter_elements(void* data, std::size_t chunk, DataType type, ReduceOp op,
                                                std::string what, std::string timeline_name) = 0;
  virtual Pending start_allgather_in_place_elements(void* data, std::size_t chunk, DataType type,
                                                    std::string what, std::string timeline_name) = 0;
  // `count` elements from (to) each rank. The defaults, for communicators of host memory (others
  // refuse), broadcast one rank's elements at a time (gather_by_broadcasts): every rank receives
  // all size() * count of them, where MPI_Gather's algorithms send each to the root by a path.
  virtual void gather_elements(const void* send, void* recv, std::size_t count, DataType type, int root,
                               const std::string& what);
  virtual void scatter_elements(const void* send, void* recv, std::size_t count, DataType type, int root,
                                const std::string& what);

 private:
  void check_allgather_sizes(std::size_t send, std::size_t recv) const;
  // `whole` elements on root for `each` per rank; root a rank.
  void check_rooted_sizes(const char* collective, std::size_t each, std::size_t whole, int root,
                          const std::string& what) const;
  // count / size(), or an error naming the collective when count is not a multiple of size().
  std::size_t chunk_of(std::size_t count, const char* collective, const std::string& what) const;
};

// Communicator::gather_elements and scatter_elements by broadcasts, through a row of host memory on
// the ranks that neither send nor keep a rank's elements; what communicators without rooted
// collectives of their own do.
void gather_by_broadcasts(Communicator& comm, const void* send, void* recv, std::size_t count, DataType type,
                          int root, const std::string& what);
void scatter_by_broadcasts(Communicator& comm, const void* send, void* recv, std::size_t count, DataType type,
                           int root, const std::string& what);

}  // namespace dptrain::distributed
