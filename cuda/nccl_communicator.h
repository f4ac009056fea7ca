// NcclCommunicator: collectives over device buffers with NCCL, beside the MPI communicator. Every
// rank joins with the same unique id, which rank 0 makes and sends to the others (over the MPI
// communicator); each rank must own a different GPU (NCCL refuses two ranks on one device). Counts
// are elements, carried by DeviceSpan.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "core/half.h"

namespace dptrain::cuda {

template <typename T>
struct DeviceSpan {
  T* data = nullptr;
  std::size_t size = 0;  // elements
};

class NcclCommunicator {
 public:
  // Rank `rank` of `size`, all with the same `id` (from new_unique_id() on one rank); call after
  // select_device(). A world of one needs nothing else.
  NcclCommunicator(const ncclUniqueId& id, int rank, int size);
  static ncclUniqueId new_unique_id();
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // In place; enqueued on `stream` (no host synchronisation).
  void allreduce_sum(DeviceSpan<float> buffer, cudaStream_t stream);
  void broadcast(DeviceSpan<float> buffer, int root, cudaStream_t stream);

  // Compressed sum: gradients x `prescale` (1/N unless already divided) cast into `staging`, summed
  // in half precision, cast back into `gradients`. Dividing before the sum keeps fp16 from
  // overflowing at 65504.
  void allreduce_sum_compressed(DeviceSpan<float> gradients, DeviceSpan<uint16_t> staging, float prescale,
                                HalfFormat format, cudaStream_t stream);

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

}  // namespace dptrain::cuda
