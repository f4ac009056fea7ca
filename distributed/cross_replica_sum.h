// SyncBatchNorm's link to the ranks: the per-channel statistics the batch_norm op asks to sum, summed
// over a Communicator (in place, synchronously: the next kernel needs them).
#pragma once

#include "core/error.h"
#include "core/ops.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

class CommunicatorSum final : public ops::CrossReplicaSum {
 public:
  explicit CommunicatorSum(Communicator& comm) : comm_(comm) {}
  void sum(double* values, int64_t n, Device device, const char* what) override {
    DPTRAIN_CHECK(comm_.accepts(device), "SyncBatchNorm: the communicator takes no ", device.str(),
                  " buffers");
    comm_.allreduce(std::span<double>(values, static_cast<std::size_t>(n)), ReduceOp::kSum, what);
  }

 private:
  Communicator& comm_;
};

}  // namespace dptrain::distributed
