// NcclCommunicator: the Communicator over device buffers with NCCL, one GPU per rank (NCCL refuses
// two ranks on one device). Collectives run on a stream of their own: each waits for the work the
// compute stream had queued when it was started (an event, llm.c's multi_gpu_async_reduce_gradient),
// and wait() makes the compute stream wait for it in turn, so neither the host nor the GPU idles
// for a reduction. A watchdog thread polls the collectives in flight and NCCL's asynchronous errors:
// past stall_warning_s it says what is waited for, past stall_abort_s (or on an NCCL error) it aborts
// the communicator and ends the process, and mpirun takes the other ranks down. The NCCL id comes
// from rank 0 over the host communicator, which also carries barrier() and gather_to_root().
// Internal to cuda/: the trainer gets one from make_nccl_communicator() (cuda/runtime.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "distributed/communicator.h"

namespace dptrain::cuda {

struct NcclWatchdog;

class NcclCommunicator final : public distributed::Communicator {
 public:
  // Rank host.rank() of host.size(), all joining through `host` (rank 0 makes the id).
  NcclCommunicator(distributed::Communicator& host, CudaBackend& backend,
                   distributed::StallPolicy stall = {});
  // Rank `rank` of `size` joining with `id` (made by new_unique_id() on one of them); `host`, if
  // given, serves barrier() and gather_to_root(). A world of one needs nothing else (tests).
  NcclCommunicator(const ncclUniqueId& id, int rank, int size, CudaBackend& backend,
                   distributed::Communicator* host = nullptr, distributed::StallPolicy stall = {});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  static ncclUniqueId new_unique_id();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts(Device device) const override { return device == backend_.device(); }

  void wait(distributed::Pending& pending) override;
  void barrier(const std::string& what) override;
  std::vector<std::string> gather_to_root(const std::string& mine, const std::string& what) override;

  distributed::Pending start_allreduce_elements(void* data, std::size_t count, distributed::DataType type,
                                                distributed::ReduceOp op, std::string what,
                                                std::string timeline_name) override;
  void allreduce_elements(void* data, std::size_t count, distributed::DataType type, distributed::ReduceOp op,
                          const std::string& what) override;
  void broadcast_elements(void* data, std::size_t count, distributed::DataType type, int root,
                          const std::string& what) override;
  void allgather_elements(const void* send, void* recv, std::size_t count, distributed::DataType type,
                          const std::string& what) override;
  distributed::Pending start_reduce_scatter_elements(void* data, std::size_t chunk,
                                                     distributed::DataType type, distributed::ReduceOp op,
                                                     std::string what, std::string timeline_name) override;
  distributed::Pending start_allgather_in_place_elements(void* data, std::size_t chunk,
                                                         distributed::DataType type, std::string what,
                                                         std::string timeline_name) override;

 private:
  void init(const ncclUniqueId& id, distributed::StallPolicy stall);
  // Orders the NCCL stream after the compute stream's queued work, runs `enqueue` there, and returns
  // the collective in flight.
  template <typename Enqueue>
  distributed::Pending launch(const std::string& what, Enqueue enqueue);
  void check_async_error() const;

  CudaBackend& backend_;
  distributed::Communicator* host_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  std::shared_ptr<NcclWatchdog> watchdog_;
};

}  // namespace dptrain::cuda
