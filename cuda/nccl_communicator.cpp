// NCCL set-up over the host communicator, the collectives on their own stream, and the watchdog.
#include "cuda/nccl_communicator.h"

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace dptrain::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using distributed::DataType;

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::kF32:
      return ncclFloat32;
    case DataType::kF64:
      return ncclFloat64;
    case DataType::kI32:
      return ncclInt32;
    case DataType::kI64:
      return ncclInt64;
    case DataType::kU64:
      return ncclUint64;
    case DataType::kU8:
      return ncclUint8;
    case DataType::kF16:
      return ncclFloat16;
    case DataType::kBf16:
      return ncclBfloat16;
    case DataType::kU16:
      break;
  }
  DPTRAIN_FAIL("NCCL has no plain 16-bit integer type; reduce uint16 data over the host communicator");
}

ncclRedOp_t nccl_op(distributed::ReduceOp op) {
  switch (op) {
    case distributed::ReduceOp::kSum:
      return ncclSum;
    case distributed::ReduceOp::kAverage:
      return ncclAvg;
    case distributed::ReduceOp::kMax:
      return ncclMax;
  }
  DPTRAIN_FAIL("unknown reduce operation");
}

// A collective in flight: its completion event on the NCCL stream. Its buffers belong to the compute
// stream's memory pool, where a block released is reused in that stream's order: so the compute
// stream waits for the collective once the work is gone, wait() or not (PyTorch's recordStream),
// and no buffer it reads or writes goes back to the pool before it has finished.
struct NcclWork final : distributed::PendingWork {
  cudaEvent_t done = nullptr;
  cudaStream_t compute = nullptr;
  ~NcclWork() override {
    if (!done) return;
    cudaStreamWaitEvent(compute, done, 0);
    cudaEventDestroy(done);  // released once complete, even if still pending now
  }
};

// NCCL refuses two ranks on one GPU with an error of its own ("Duplicate GPU detected"), and a
// launcher that shows every rank a single GPU through CUDA_VISIBLE_DEVICES hides the sharing from
// the device count (cuda/device.cpp): the GPUs' UUIDs, gathered over the host, tell.
void check_one_gpu_per_rank(distributed::Communicator& host, int device) {
  cudaDeviceProp properties{};
  DPTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  constexpr std::size_t kUuid = sizeof properties.uuid.bytes;
  std::array<uint8_t, kUuid> mine{};
  std::memcpy(mine.data(), properties.uuid.bytes, kUuid);
  std::vector<uint8_t> all(kUuid * static_cast<std::size_t>(host.size()));
  host.allgather(std::span<const uint8_t>(mine), std::span<uint8_t>(all),
                 "allgather of the ranks' GPU UUIDs");
  for (int a = 0; a < host.size(); ++a)
    for (int b = a + 1; b < host.size(); ++b)
      DPTRAIN_CHECK(std::memcmp(&all[a * kUuid], &all[b * kUuid], kUuid) != 0, "ranks ", a, " and ", b,
                    " would share one GPU (", properties.name,
                    "), which NCCL refuses: give each rank a GPU of its own, or set distributed.backend to "
                    "\"mpi\" to let ranks share GPUs");
}

}  // namespace

// Watches the collectives in flight and NCCL's asynchronous error state from a thread of its own.
struct NcclWatchdog {
  struct Entry {
    std::shared_ptr<NcclWork> work;
    std::string what;
    Clock::time_point since;
    bool warned = false;
  };
  distributed::StallPolicy policy;
  int rank, device;
  ncclComm_t comm;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Entry> in_flight;
  bool stop = false;
  std::thread thread;

  NcclWatchdog(distributed::StallPolicy p, int r, int d, ncclComm_t c)
      : policy(p), rank(r), device(d), comm(c) {
    thread = std::thread([this] { loop(); });
  }
  ~NcclWatchdog() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }

  void add(std::shared_ptr<NcclWork> work, const std::string& what) {
    std::lock_guard lock(mutex);
    in_flight.push_back({std::move(work), what, Clock::now(), false});
  }

  [[noreturn]] void abort(const std::string& message) {
    std::fprintf(stderr, "dptrain: error on rank %d: %s\n", rank, message.c_str());
    std::fflush(stderr);
    // ncclCommAbort frees the communicator's resources and makes its stuck kernels return, but it
    // has been seen to hang when another thread is inside NCCL (NVIDIA/nccl#829): it gets 10 s on a
    // thread of its own, then the process ends regardless. An exit without MPI_Finalize makes
    // mpirun stop the whole job.
    auto aborted = std::make_shared<std::atomic<bool>>(false);
    std::thread([c = comm, aborted] {
      ncclCommAbort(c);
      *aborted = true;
    }).detach();
    for (int waited_ms = 0; !*aborted && waited_ms < 10000; waited_ms += 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::_Exit(1);
  }

  void loop() {
    cudaSetDevice(device);
    std::unique_lock lock(mutex);
    while (!stop) {
      wake.wait_for(lock, std::chrono::milliseconds(100));
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress)
        abort(std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async));
      while (!in_flight.empty() && cudaEventQuery(in_flight.front().work->done) != cudaErrorNotReady)
        in_flight.pop_front();
      if (in_flight.empty()) continue;
      Entry& oldest = in_flight.front();
      const double waited = std::chrono::duration<double>(Clock::now() - oldest.since).count();
      if (policy.warning_s > 0 && !oldest.warned && waited > policy.warning_s) {
        std::fprintf(stderr, "dptrain: rank %d has waited %.0f s in %s; a peer may be stalled or dead\n",
                     rank, waited, oldest.what.c_str());
        std::fflush(stderr);
        oldest.warned = true;
      }
      if (policy.abort_s > 0 && waited > policy.abort_s) {
        char message[512];
        std::snprintf(
            message, sizeof message,
            "stalled %.0f s in %s (distributed.stall_abort_s = %g); check the other ranks' output for the "
            "first error",
            waited, oldest.what.c_str(), policy.abort_s);
        abort(message);
      }
    }
  }
};

ncclUniqueId NcclCommunicator::new_unique_id() {
  ncclUniqueId id;
  DPTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

NcclCommunicator::NcclCommunicator(distributed::Communicator& host, CudaBackend& backend,
                                   distributed::StallPolicy stall)
    : backend_(backend), host_(&host), rank_(host.rank()), size_(host.size()) {
  check_one_gpu_per_rank(host, backend.device().index);
  ncclUniqueId id{};
  if (rank_ == 0) id = new_unique_id();
  host.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&id), sizeof id), 0,
                 "broadcast of the NCCL unique id");
  init(id, stall);
}

NcclCommunicator::NcclCommunicator(const ncclUniqueId& id, int rank, int size, CudaBackend& backend,
                                   distributed::Communicator* host, distributed::StallPolicy stall)
    : backend_(backend), host_(host), rank_(rank), size_(size) {
  init(id, stall);
}

void NcclCommunicator::init(const ncclUniqueId& id, distributed::StallPolicy stall) {
  DPTRAIN_CUDA_CHECK(cudaSetDevice(backend_.device().index));
  DPTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DPTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  DPTRAIN_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  watchdog_ = std::make_shared<NcclWatchdog>(stall, rank_, backend_.device().index, comm_);
}

NcclCommunicator::~NcclCommunicator() {
  watchdog_.reset();
  // Unwinding from an error, a collective may never finish: waiting for it, or destroying the
  // communicator under it, would hang where the job is about to stop anyway. Left to the exit.
  if (std::uncaught_exceptions() > 0) return;
  if (stream_) cudaStreamSynchronize(stream_);
  if (comm_) ncclCommDestroy(comm_);
  if (compute_ready_) cudaEventDestroy(compute_ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::check_async_error() const {
  ncclResult_t async = ncclSuccess;
  DPTRAIN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  DPTRAIN_CHECK(async == ncclSuccess || async == ncclInProgress, "NCCL asynchronous error on rank ", rank_,
                ": ", ncclGetErrorString(async));
}

template <typename Enqueue>
distributed::Pending NcclCommunicator::launch(const std::string& what, Enqueue enqueue) {
  check_async_error();
  DPTRAIN_CUDA_CHECK(cudaEventRecord(compute_ready_, backend_.compute_stream()));
  DPTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  enqueue();
  auto work = std::make_shared<NcclWork>();
  work->compute = backend_.compute_stream();
  DPTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&work->done, cudaEventDisableTiming));
  DPTRAIN_CUDA_CHECK(cudaEventRecord(work->done, stream_));
  watchdog_->add(work, what);
  return distributed::Pending(std::move(work));
}

distributed::Pending NcclCommunicator::start_allreduce_elements(void* data, std::size_t count, DataType type,
                                                                distributed::ReduceOp op, std::string what,
                                                                std::string) {
  if (count == 0) return {};
  const ncclRedOp_t reduce = nccl_op(op);
  return launch(what, [&] {
    DPTRAIN_NCCL_CHECK(ncclAllReduce(data, data, count, nccl_type(type), reduce, comm_, stream_));
  });
}

void NcclCommunicator::wait(distributed::Pending& pending) {
  if (!pending.active()) return;
  const std::shared_ptr<NcclWork> work = std::static_pointer_cast<NcclWork>(pending.take());
  // The compute stream waits, not the host: what follows on the GPU sees the result.
  DPTRAIN_CUDA_CHECK(cudaStreamWaitEvent(backend_.compute_stream(), work->done, 0));
  check_async_error();
}

void NcclCommunicator::allreduce_elements(void* data, std::size_t count, DataType type,
                                          distributed::ReduceOp op, const std::string& what) {
  // An empty call is still a fence (communicator.h): the compute stream waits for the collectives
  // queued on stream_ before it.
  distributed::Pending p =
      count == 0 ? launch(what, [] {}) : start_allreduce_elements(data, count, type, op, what, {});
  wait(p);
}

void NcclCommunicator::broadcast_elements(void* data, std::size_t count, DataType type, int root,
                                          const std::string& what) {
  distributed::Pending p = launch(what, [&] {
    if (count > 0)
      DPTRAIN_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(type), root, comm_, stream_));
  });
  wait(p);
}

void NcclCommunicator::allgather_elements(const void* send, void* recv, std::size_t count, DataType type,
                                          const std::string& what) {
  distributed::Pending p = launch(
      what, [&] { DPTRAIN_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(type), comm_, stream_)); });
  wait(p);
}

// In place as NCCL defines it: the result goes to this rank's chunk of the buffer it reads.
distributed::Pending NcclCommunicator::start_reduce_scatter_elements(void* data, std::size_t chunk,
                                                                     DataType type, distributed::ReduceOp op,
                                                                     std::string what, std::string) {
  if (chunk == 0) return {};
  const ncclRedOp_t reduce = nccl_op(op);
  char* mine =
      static_cast<char*>(data) + static_cast<std::size_t>(rank_) * chunk * distributed::element_size(type);
  return launch(what, [&] {
    DPTRAIN_NCCL_CHECK(ncclReduceScatter(data, mine, chunk, nccl_type(type), reduce, comm_, stream_));
  });
}

distributed::Pending NcclCommunicator::start_allgather_in_place_elements(void* data, std::size_t chunk,
                                                                         DataType type, std::string what,
                                                                         std::string) {
  if (chunk == 0) return {};
  const char* mine = static_cast<const char*>(data) +
                     static_cast<std::size_t>(rank_) * chunk * distributed::element_size(type);
  return launch(
      what, [&] { DPTRAIN_NCCL_CHECK(ncclAllGather(mine, data, chunk, nccl_type(type), comm_, stream_)); });
}

void NcclCommunicator::barrier(const std::string& what) {
  if (host_) return host_->barrier(what);
  DPTRAIN_CHECK(size_ == 1, "NcclCommunicator::barrier needs a host communicator (", what, ")");
}

std::vector<std::string> NcclCommunicator::gather_to_root(const std::string& mine, const std::string& what) {
  if (host_) return host_->gather_to_root(mine, what);
  DPTRAIN_CHECK(size_ == 1, "NcclCommunicator::gather_to_root needs a host communicator (", what, ")");
  return {mine};
}

}  // namespace dptrain::cuda
