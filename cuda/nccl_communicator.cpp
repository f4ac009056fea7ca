// NCCL communicator set-up over MPI and its collectives.
#include "cuda/nccl_communicator.h"

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace dptrain::cuda {

ncclUniqueId NcclCommunicator::new_unique_id() {
  ncclUniqueId id;
  DPTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

NcclCommunicator::NcclCommunicator(const ncclUniqueId& id, int rank, int size) : rank_(rank), size_(size) {
  DPTRAIN_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

void NcclCommunicator::allreduce_sum(DeviceSpan<float> buffer, cudaStream_t stream) {
  if (buffer.size == 0) return;
  DPTRAIN_NCCL_CHECK(
      ncclAllReduce(buffer.data, buffer.data, buffer.size, ncclFloat32, ncclSum, comm_, stream));
}

void NcclCommunicator::broadcast(DeviceSpan<float> buffer, int root, cudaStream_t stream) {
  if (buffer.size == 0) return;
  DPTRAIN_NCCL_CHECK(ncclBroadcast(buffer.data, buffer.data, buffer.size, ncclFloat32, root, comm_, stream));
}

void NcclCommunicator::allreduce_sum_compressed(DeviceSpan<float> gradients, DeviceSpan<uint16_t> staging,
                                                float prescale, HalfFormat format, cudaStream_t stream) {
  DPTRAIN_CHECK(staging.size >= gradients.size, "compressed allreduce: staging holds ", staging.size,
                " halves for ", gradients.size, " gradients");
  if (gradients.size == 0) return;
  const auto n = static_cast<int64_t>(gradients.size);
  floats_to_halves(gradients.data, staging.data, n, prescale, format, stream);
  DPTRAIN_NCCL_CHECK(ncclAllReduce(staging.data, staging.data, gradients.size,
                                   format == HalfFormat::kFp16 ? ncclFloat16 : ncclBfloat16, ncclSum, comm_,
                                   stream));
  halves_to_floats(staging.data, gradients.data, n, format, stream);
}

}  // namespace dptrain::cuda
