// MPI collectives and the stall watchdog.
#include "distributed/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "distributed/communication_thread.h"
#include "distributed/mpi_check.h"
#include "distributed/shared_memory_reduce.h"

namespace dptrain::distributed {
namespace {

using Clock = std::chrono::steady_clock;

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
    case DataType::kF32:
      return MPI_FLOAT;
    case DataType::kF64:
      return MPI_DOUBLE;
    case DataType::kI32:
      return MPI_INT32_T;
    case DataType::kI64:
      return MPI_INT64_T;
    case DataType::kU64:
      return MPI_UINT64_T;
    case DataType::kU16:
    case DataType::kF16:
    case DataType::kBf16:
      return MPI_UINT16_T;
    case DataType::kU8:
      return MPI_UINT8_T;
  }
  DPTRAIN_FAIL("unknown DataType");
}

int checked_count(std::size_t elements) {
  DPTRAIN_CHECK(elements <= static_cast<std::size_t>(INT32_MAX), "collective of ", elements,
                " elements exceeds MPI's int count; split it");
  return static_cast<int>(elements);
}

void fp16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  add_halves(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len, HalfFormat::kFp16);
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  add_halves(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len, HalfFormat::kBf16);
}

// Half-precision sums as MPI user operations, created once per process (MPI_Finalize frees them).
MPI_Op half_sum_op(HalfFormat format) {
  static std::once_flag once;
  static MPI_Op ops[2];
  std::call_once(once, [] {
    DPTRAIN_MPI_CHECK(MPI_Op_create(fp16_sum, /*commute=*/1, &ops[0]));
    DPTRAIN_MPI_CHECK(MPI_Op_create(bf16_sum, /*commute=*/1, &ops[1]));
  });
  return ops[format == HalfFormat::kFp16 ? 0 : 1];
}

// MPI's op for `op` on `type` (half types sum in half precision, and only sum).
MPI_Op sum_op(DataType type, ReduceOp op) {
  const bool half = type == DataType::kF16 || type == DataType::kBf16;
  DPTRAIN_CHECK(!half || op == ReduceOp::kSum, "a half-precision reduction only sums (pre-scale instead)");
  if (op == ReduceOp::kMax) return MPI_MAX;
  return half ? half_sum_op(type == DataType::kF16 ? HalfFormat::kFp16 : HalfFormat::kBf16) : MPI_SUM;
}

// Divides `count` elements by `size` in place: a sum becomes an average (MPI has no average).
void divide_by(void* data, std::size_t count, DataType type, int size) {
  const auto divide = [&]<typename T>(T* values) {
    for (std::size_t i = 0; i < count; ++i) values[i] /= static_cast<T>(size);
  };
  switch (type) {
    case DataType::kF32:
      return divide(static_cast<float*>(data));
    case DataType::kF64:
      return divide(static_cast<double*>(data));
    case DataType::kI32:
      return divide(static_cast<int32_t*>(data));
    case DataType::kI64:
      return divide(static_cast<int64_t*>(data));
    case DataType::kU64:
      return divide(static_cast<uint64_t*>(data));
    case DataType::kU16:
      return divide(static_cast<uint16_t*>(data));
    case DataType::kU8:
      return divide(static_cast<uint8_t*>(data));
    case DataType::kF16:
    case DataType::kBf16:
      break;
  }
}

// The sum (or average) of `count` elements over `comm`, in place.
void allreduce_now(void* data, std::size_t count, DataType type, ReduceOp op, MPI_Comm comm, int size) {
  DPTRAIN_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(type), sum_op(type, op), comm));
  if (op == ReduceOp::kAverage) divide_by(data, count, type, size);
}

// Chunk `rank` of `data` (size x chunk elements) becomes that chunk's sum (or average) over `comm`:
// a ring of size - 1 exchanges, each rank passing on the partial sum of one chunk and adding the one
// it receives into its own copy (MPI_Reduce_local, so half types use their op). Open MPI 4.1's
// MPI_Reduce_scatter_block took 19.6 ms for 4 MiB of floats at np 2 on one host where this takes
// 0.37 ms, and its MPI_Allreduce 1.2 ms (docs/results.md). The partial sums are added in ring order:
// fixed for a given size.
void reduce_scatter_now(void* data, std::size_t chunk, DataType type, ReduceOp op, MPI_Comm comm, int rank,
                        int size) {
  constexpr int kRingTag = 0x5c47;  // no other point-to-point message uses this tag
  const std::size_t chunk_bytes = chunk * element_size(type);
  const auto chunk_at = [&](int index) {
    return static_cast<char*>(data) + static_cast<std::size_t>(index) * chunk_bytes;
  };
  thread_local std::vector<char> received;
  if (received.size() < chunk_bytes) received.resize(chunk_bytes);
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  // Step s passes on chunk rank - s - 1 and receives chunk rank - s - 2: the last received is this rank's.
  for (int step = 0; step < size - 1; ++step) {
    const int send = ((rank - step - 1) % size + size) % size,
              receive = ((rank - step - 2) % size + size) % size;
    DPTRAIN_MPI_CHECK(MPI_Sendrecv(chunk_at(send), checked_count(chunk), mpi_type(type), next, kRingTag,
                                   received.data(), checked_count(chunk), mpi_type(type), previous, kRingTag,
                                   comm, MPI_STATUS_IGNORE));
    DPTRAIN_MPI_CHECK(MPI_Reduce_local(received.data(), chunk_at(receive), checked_count(chunk),
                                       mpi_type(type), sum_op(type, op)));
  }
  if (op == ReduceOp::kAverage) divide_by(chunk_at(rank), chunk, type, size);
}

}  // namespace

// Watches collectives in flight, two slots: the calling thread's and the communication thread's.
struct StallWatchdog {
  struct Slot {
    bool active = false, warned = false;
    Clock::time_point since;
    std::string what;
  };
  StallPolicy policy;
  int rank;
  std::mutex mutex;
  std::condition_variable wake;
  Slot slots[2];
  bool stop = false;
  std::thread thread;

  StallWatchdog(StallPolicy p, int r) : policy(p), rank(r) {
    if (policy.warning_s > 0 || policy.abort_s > 0) thread = std::thread([this] { loop(); });
  }
  ~StallWatchdog() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    wake.notify_all();
    if (thread.joinable()) thread.join();
  }

  void enter(int slot, const std::string& what) {
    std::lock_guard lock(mutex);
    slots[slot] = {true, false, Clock::now(), what};
  }
  void leave(int slot) {
    std::lock_guard lock(mutex);
    slots[slot].active = false;
  }

  void loop() {
    std::unique_lock lock(mutex);
    while (!stop) {
      wake.wait_for(lock, std::chrono::milliseconds(100));
      for (Slot& s : slots) {
        if (!s.active) continue;
        const double waited = std::chrono::duration<double>(Clock::now() - s.since).count();
        if (policy.warning_s > 0 && !s.warned && waited > policy.warning_s) {
          std::fprintf(stderr, "dptrain: rank %d has waited %.0f s in %s; a peer may be stalled or dead\n",
                       rank, waited, s.what.c_str());
          std::fflush(stderr);
          s.warned = true;
        }
        if (policy.abort_s > 0 && waited > policy.abort_s) {
          std::fprintf(stderr,
                       "dptrain: error on rank %d: stalled %.0f s in %s (distributed.stall_abort_s = %g); "
                       "check the other ranks' output for the first error\n",
                       rank, waited, s.what.c_str(), policy.abort_s);
          std::fflush(stderr);
          // This thread may not call MPI while another is inside it; an exit without MPI_Finalize
          // makes mpirun stop the whole job.
          std::_Exit(1);
        }
      }
    }
  }
};

// RAII: a collective in flight on one slot.
class Watch {
 public:
  Watch(StallWatchdog* dog, int slot, const std::string& what) : dog_(dog), slot_(slot) {
    if (dog_) dog_->enter(slot_, what);
  }
  ~Watch() {
    if (dog_) dog_->leave(slot_);
  }

 private:
  StallWatchdog* dog_;
  int slot_;
};

MpiCommunicator::MpiCommunicator(const World& world, StallPolicy stall, bool shared_memory)
    : rank_(world.rank()), size_(world.size()), shared_memory_(shared_memory && world.hosts() == 1) {
  if (size_ > 1) watchdog_ = std::make_shared<StallWatchdog>(stall, rank_);
  // The thread may outlive this object (~CommunicationThread): it keeps the watchdog alive.
  thread_ = std::make_unique<CommunicationThread>(
      [dog = watchdog_](const std::string& what, const std::function<void()>& run) {
        Watch watch(dog.get(), 1, what);
        run();
      });
}

MpiCommunicator::~MpiCommunicator() = default;

StoragePtr MpiCommunicator::allocate_reduction_buffer(std::size_t bytes, Device device) {
  if (size_ == 1 || !shared_memory_ || !device.is_host() || bytes == 0) return make_storage(bytes, device);
  drain();  // the communication thread reads segments_
  std::string why_not;
  std::shared_ptr<SharedMemorySegment> segment = SharedMemorySegment::create(bytes, rank_, size_, &why_not);
  if (!segment) {
    if (rank_ == 0)
      std::fprintf(stderr,
                   "dptrain: note: the collectives on a buffer of %.1f MB go through MPI, not shared memory: "
                   "%s\n",
                   static_cast<double>(bytes) / 1e6, why_not.c_str());
    return make_storage(bytes, device);
  }
  std::erase_if(segments_, [](const auto& s) { return s.expired(); });
  segments_.push_back(segment);
  return std::make_shared<Storage>(segment->mine(), bytes, device, segment);
}

bool MpiCommunicator::reduces_in_shared_memory(const void* data) const {
  return std::ranges::any_of(segments_, [&](const auto& weak) {
    const auto segment = weak.lock();
    return segment && segment->contains(data, 1);
  });
}

uint64_t MpiCommunicator::shared_memory_collectives() const {
  uint64_t total = 0;
  for (const auto& weak : segments_)
    if (const auto segment = weak.lock()) total += segment->collectives();
  return total;
}

std::shared_ptr<SharedMemorySegment> MpiCommunicator::segment_holding(const void* data,
                                                                      std::size_t bytes) const {
  for (const auto& weak : segments_)
    if (auto segment = weak.lock(); segment && segment->contains(data, bytes)) return segment;
  return nullptr;
}

std::shared_ptr<SharedMemorySegment> MpiCommunicator::segment_for(const void* data, std::size_t count,
                                                                  DataType type, ReduceOp op) const {
  if (!SharedMemorySegment::supports(type, op)) return nullptr;
  return segment_holding(data, count * element_size(type));
}

Pending MpiCommunicator::start_allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                                                  std::string what, std::string timeline_name) {
  if (size_ == 1 || count == 0) return {};
  if (auto segment = segment_for(data, count, type, op))
    return enqueue(what, std::move(timeline_name), [segment, data, count, type, op, what] {
      segment->allreduce(data, count, type, op, what);
    });
  return enqueue(std::move(what), std::move(timeline_name), [data, count, type, op, size = size_] {
    allreduce_now(data, count, type, op, MPI_COMM_WORLD, size);
  });
}

std::optional<Pending> MpiCommunicator::start_sum_testing_finite(std::span<float> buffer, bool* finite,
                                                                 std::string what, std::string timeline_name,
                                                                 bool synchronous) {
  if (size_ == 1 || buffer.empty()) return std::nullopt;
  auto segment = segment_for(buffer.data(), buffer.size(), DataType::kF32, ReduceOp::kSum);
  if (!segment) return std::nullopt;
  const auto run = [segment, buffer, finite, what] {
    segment->allreduce(buffer.data(), buffer.size(), DataType::kF32, ReduceOp::kSum, what, finite);
  };
  if (!synchronous) return enqueue(what, std::move(timeline_name), run);
  drain();
  Watch watch(watchdog_.get(), 0, what);
  run();
  return Pending{};
}

Pending MpiCommunicator::start_reduce_scatter_elements(void* data, std::size_t chunk, DataType type,
                                                       ReduceOp op, std::string what,
                                                       std::string timeline_name) {
  if (size_ == 1 || chunk == 0) return {};
  if (auto segment = segment_for(data, chunk * static_cast<std::size_t>(size_), type, op))
    return enqueue(what, std::move(timeline_name), [segment, data, chunk, type, op, what] {
      segment->reduce_scatter(data, chunk, type, op, what);
    });
  return enqueue(std::move(what), std::move(timeline_name),
                 [data, chunk, type, op, rank = rank_, size = size_] {
                   reduce_scatter_now(data, chunk, type, op, MPI_COMM_WORLD, rank, size);
                 });
}

Pending MpiCommunicator::start_allgather_in_place_elements(void* data, std::size_t chunk, DataType type,
                                                           std::string what, std::string timeline_name) {
  if (size_ == 1 || chunk == 0) return {};
  if (auto segment = segment_holding(data, chunk * static_cast<std::size_t>(size_) * element_size(type)))
    return enqueue(what, std::move(timeline_name),
                   [segment, data, chunk, type, what] { segment->allgather(data, chunk, type, what); });
  return enqueue(std::move(what), std::move(timeline_name), [data, chunk, type] {
    DPTRAIN_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, checked_count(chunk),
                                    mpi_type(type), MPI_COMM_WORLD));
  });
}

Pending MpiCommunicator::enqueue(std::string what, std::string timeline_name, std::function<void()> run) {
  return thread_->enqueue(std::move(what), std::move(timeline_name), std::move(run));
}

void MpiCommunicator::wait(Pending& pending) {
  thread_->wait(pending);
}

void MpiCommunicator::drain() {
  thread_->drain();
}

bool MpiCommunicator::abandon_queued(std::chrono::milliseconds grace) {
  return thread_->abandon_queued(grace);
}

void MpiCommunicator::allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                                         const std::string& what) {
  if (size_ == 1) return;
  drain();  // an empty call too: it is still a fence for the queued collectives (communicator.h)
  if (count == 0) return;
  Watch watch(watchdog_.get(), 0, what);
  if (auto segment = segment_for(data, count, type, op))
    return segment->allreduce(data, count, type, op, what);
  allreduce_now(data, count, type, op, MPI_COMM_WORLD, size_);
}

void MpiCommunicator::broadcast_elements(void* data, std::size_t count, DataType type, int root,
                                         const std::string& what) {
  if (size_ == 1) return;
  drain();
  if (count == 0) return;
  Watch watch(watchdog_.get(), 0, what);
  DPTRAIN_MPI_CHECK(MPI_Bcast(data, checked_count(count), mpi_type(type), root, MPI_COMM_WORLD));
}

void MpiCommunicator::allgather_elements(const void* send, void* recv, std::size_t count, DataType type,
                                         const std::string& what) {
  if (size_ == 1) {
    if (count > 0) std::memcpy(recv, send, count * element_size(type));  // an empty span's data may be null
    return;
  }
  drain();
  Watch watch(watchdog_.get(), 0, what);
  DPTRAIN_MPI_CHECK(MPI_Allgather(send, checked_count(count), mpi_type(type), recv, checked_count(count),
                                  mpi_type(type), MPI_COMM_WORLD));
}

void MpiCommunicator::gather_elements(const void* send, void* recv, std::size_t count, DataType type,
                                      int root, const std::string& what) {
  rooted(Rooted::kGather, send, recv, count, type, root, what);
}

void MpiCommunicator::scatter_elements(const void* send, void* recv, std::size_t count, DataType type,
                                       int root, const std::string& what) {
  rooted(Rooted::kScatter, send, recv, count, type, root, what);
}

void MpiCommunicator::rooted(Rooted collective, const void* send, void* recv, std::size_t count,
                             DataType type, int root, const std::string& what) {
  if (size_ == 1) {
    if (count > 0) std::memcpy(recv, send, count * element_size(type));
    return;
  }
  drain();
  Watch watch(watchdog_.get(), 0, what);
  const auto call = collective == Rooted::kGather ? MPI_Gather : MPI_Scatter;
  DPTRAIN_MPI_CHECK(call(send, checked_count(count), mpi_type(type), recv, checked_count(count),
                         mpi_type(type), root, MPI_COMM_WORLD));
}

void MpiCommunicator::barrier(const std::string& what) {
  if (size_ == 1) return;
  drain();
  Watch watch(watchdog_.get(), 0, what);
  DPTRAIN_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

std::vector<std::string> MpiCommunicator::gather_to_root(const std::string& mine, const std::string& what) {
  if (size_ == 1) return {mine};
  drain();
  Watch watch(watchdog_.get(), 0, what);
  const int length = checked_count(mine.size());
  std::vector<int> lengths(rank_ == 0 ? size_ : 0), offsets(lengths.size());
  DPTRAIN_MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string all;
  if (rank_ == 0) {
    std::size_t total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[r] = checked_count(total);
      total += static_cast<std::size_t>(lengths[r]);
    }
    all.resize(total);
    checked_count(total);  // the displacements are ints as well
  }
  DPTRAIN_MPI_CHECK(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                                MPI_CHAR, 0, MPI_COMM_WORLD));
  std::vector<std::string> out;
  for (int r = 0; rank_ == 0 && r < size_; ++r) out.push_back(all.substr(offsets[r], lengths[r]));
  return out;
}

}  // namespace dptrain::distributed
