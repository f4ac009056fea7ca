// MpiCommunicator: the Communicator over MPI_COMM_WORLD and host memory, with MPI's blocking
// collectives, which Open MPI tunes far better than their non-blocking forms (MPI_Iallreduce
// measured 5x slower at 4 KiB here, and it only progresses when polled). Asynchrony comes from a
// communication thread instead: start_allreduce queues a collective that runs there, in submission
// order, while the caller computes (Horovod's design). A watchdog thread sees every collective in
// flight: past stall_warning_s it says what is waited for; past stall_abort_s it ends the process,
// and mpirun takes the other ranks down. Where all ranks share one host, buffers from
// allocate_reduction_buffer are reduced in shared memory without copies (shared_memory_reduce.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/world.h"

namespace dptrain::distributed {

class CommunicationThread;
struct StallWatchdog;
class SharedMemorySegment;

class MpiCommunicator final : public Communicator {
 public:
  // Over every rank of `world`; a world of one turns every collective into a no-op. Without
  // `shared_memory`, reduction buffers are ordinary memory and every collective goes through MPI.
  explicit MpiCommunicator(const World& world, StallPolicy stall = {}, bool shared_memory = true);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts(Device device) const override { return device.is_host(); }
  StoragePtr allocate_reduction_buffer(std::size_t bytes, Device device) override;
  bool reduces_in_shared_memory(const void* data) const override;
  // In a shared-memory segment only (SharedMemorySegment::allreduce tests the sums).
  std::optional<Pending> start_sum_testing_finite(std::span<float> buffer, bool* finite, std::string what,
                                                  std::string timeline_name, bool synchronous) override;
  // Collectives that ran in shared memory so far (tests and benches check the path taken).
  uint64_t shared_memory_collectives() const;

  void wait(Pending& pending) override;
  bool abandon_queued(std::chrono::milliseconds grace) override;
  void barrier(const std::string& what) override;
  std::vector<std::string> gather_to_root(const std::string& mine, const std::string& what) override;
  Pending start_allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                                   std::string what, std::string timeline_name) override;
  void allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                          const std::string& what) override;
  void broadcast_elements(void* data, std::size_t count, DataType type, int root,
                          const std::string& what) override;
  void allgather_elements(const void* send, void* recv, std::size_t count, DataType type,
                          const std::string& what) override;
  void gather_elements(const void* send, void* recv, std::size_t count, DataType type, int root,
                       const std::string& what) override;
  void scatter_elements(const void* send, void* recv, std::size_t count, DataType type, int root,
                        const std::string& what) override;
  Pending start_reduce_scatter_elements(void* data, std::size_t chunk, DataType type, ReduceOp op,
                                        std::string what, std::string timeline_name) override;
  Pending start_allgather_in_place_elements(void* data, std::size_t chunk, DataType type, std::string what,
                                            std::string timeline_name) override;

 private:
  // Queues `run` on the communication thread (started on first use); in submission order.
  Pending enqueue(std::string what, std::string timeline_name, std::function<void()> run);
  void drain();
  // MPI_Gather or MPI_Scatter of `count` elements a rank (a copy in a world of one).
  enum class Rooted { kGather, kScatter };
  void rooted(Rooted collective, const void* send, void* recv, std::size_t count, DataType type, int root,
              const std::string& what);
  // The shared segment that holds `bytes` at `data`, if any.
  std::shared_ptr<SharedMemorySegment> segment_holding(const void* data, std::size_t bytes) const;
  // The shared segment that holds `count` elements of `type` at `data`, if it can reduce them with `op`.
  std::shared_ptr<SharedMemorySegment> segment_for(const void* data, std::size_t count, DataType type,
                                                   ReduceOp op) const;

  int rank_ = 0, size_ = 1;
  bool shared_memory_ = false;  // ranks on one host, and not turned off
  // The segments behind the reduction buffers handed out; each lives as long as its buffer.
  std::vector<std::weak_ptr<SharedMemorySegment>> segments_;
  std::shared_ptr<StallWatchdog> watchdog_;
  std::unique_ptr<CommunicationThread> thread_;  // runs the asynchronous collectives
};

}  // namespace dptrain::distributed
