// StagedCommunicator: collectives over a device's buffers through a host communicator (MPI): each
// buffer is copied to the host, reduced there, and copied back. For ranks that cannot each own a
// GPU (several ranks on one GPU; NCCL refuses that), and for one-GPU machines that test multi-rank
// logic: distributed.backend "mpi" on a GPU. Correct and simple rather than fast: collectives run
// when started, so nothing overlaps with backward, and each costs two copies over PCIe.
#pragma once

#include <string>
#include <vector>

#include "core/backend.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

class StagedCommunicator final : public Communicator {
 public:
  // Reduces buffers of `device` (through its backend's copies) over `host`, which must accept host
  // memory.
  StagedCommunicator(Communicator& host, Device device);

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  bool accepts(Device device) const override { return device == device_; }

  void wait(Pending& pending) override { pending.take(); }
  void barrier(const std::string& what) override { host_.barrier(what); }
  std::vector<std::string> gather_to_root(const std::string& mine, const std::string& what) override {
    return host_.gather_to_root(mine, what);
  }

  Pending start_allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                                   std::string what, std::string timeline_name) override;
  void allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                          const std::string& what) override;
  void broadcast_elements(void* data, std::size_t count, DataType type, int root,
                          const std::string& what) override;
  void allgather_elements(const void* send, void* recv, std::size_t count, DataType type,
                          const std::string& what) override;
  Pending start_reduce_scatter_elements(void* data, std::size_t chunk, DataType type, ReduceOp op,
                                        std::string what, std::string timeline_name) override;
  Pending start_allgather_in_place_elements(void* data, std::size_t chunk, DataType type, std::string what,
                                            std::string timeline_name) override;

 private:
  Communicator& host_;
  Device device_;
  Backend& backend_;
  std::vector<char> staging_, gathered_;
};

}  // namespace dptrain::distributed
