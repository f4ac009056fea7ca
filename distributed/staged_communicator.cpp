// Device collectives staged through host memory.
#include "distributed/staged_communicator.h"

#include "core/error.h"

namespace dptrain::distributed {

StagedCommunicator::StagedCommunicator(Communicator& host, Device device)
    : host_(host), device_(device), backend_(backend_for(device)) {
  DPTRAIN_CHECK(host_.accepts(Device::cpu()), "a staged communicator needs a host communicator underneath");
}

Pending StagedCommunicator::start_allreduce_elements(void* data, std::size_t count, DataType type,
                                                     ReduceOp op, std::string what, std::string) {
  allreduce_elements(data, count, type, op, what);
  return {};
}

void StagedCommunicator::allreduce_elements(void* data, std::size_t count, DataType type, ReduceOp op,
                                            const std::string& what) {
  if (size() == 1 || count == 0) return;
  const std::size_t bytes = count * element_size(type);
  staging_.resize(bytes);
  backend_.copy_to_host(staging_.data(), data, bytes);
  host_.allreduce_elements(staging_.data(), count, type, op, what);
  backend_.copy_from_host(data, staging_.data(), bytes);
}

void StagedCommunicator::broadcast_elements(void* data, std::size_t count, DataType type, int root,
                                            const std::string& what) {
  if (size() == 1 || count == 0) return;
  const std::size_t bytes = count * element_size(type);
  staging_.resize(bytes);
  if (rank() == root) backend_.copy_to_host(staging_.data(), data, bytes);
  host_.broadcast_elements(staging_.data(), count, type, root, what);
  if (rank() != root) backend_.copy_from_host(data, staging_.data(), bytes);
}

void StagedCommunicator::allgather_elements(const void* send, void* recv, std::size_t count, DataType type,
                                            const std::string& what) {
  const std::size_t bytes = count * element_size(type);
  staging_.resize(bytes);
  gathered_.resize(bytes * static_cast<std::size_t>(size()));
  backend_.copy_to_host(staging_.data(), send, bytes);
  host_.allgather_elements(staging_.data(), gathered_.data(), count, type, what);
  backend_.copy_from_host(recv, gathered_.data(), gathered_.size());
}

// The whole buffer goes down; only this rank's chunk, the one that holds a result, comes back.
Pending StagedCommunicator::start_reduce_scatter_elements(void* data, std::size_t chunk, DataType type,
                                                          ReduceOp op, std::string what, std::string) {
  if (size() == 1 || chunk == 0) return {};
  const std::size_t chunk_bytes = chunk * element_size(type),
                    offset = static_cast<std::size_t>(rank()) * chunk_bytes;
  staging_.resize(chunk_bytes * static_cast<std::size_t>(size()));
  backend_.copy_to_host(staging_.data(), data, staging_.size());
  Pending pending =
      host_.start_reduce_scatter_elements(staging_.data(), chunk, type, op, std::move(what), {});
  host_.wait(pending);
  backend_.copy_from_host(static_cast<char*>(data) + offset, staging_.data() + offset, chunk_bytes);
  return {};
}

// This rank's chunk goes down, every chunk comes back.
Pending StagedCommunicator::start_allgather_in_place_elements(void* data, std::size_t chunk, DataType type,
                                                              std::string what, std::string) {
  if (size() == 1 || chunk == 0) return {};
  const std::size_t chunk_bytes = chunk * element_size(type),
                    offset = static_cast<std::size_t>(rank()) * chunk_bytes;
  staging_.resize(chunk_bytes * static_cast<std::size_t>(size()));
  backend_.copy_to_host(staging_.data() + offset, static_cast<const char*>(data) + offset, chunk_bytes);
  Pending pending =
      host_.start_allgather_in_place_elements(staging_.data(), chunk, type, std::move(what), {});
  host_.wait(pending);
  backend_.copy_from_host(data, staging_.data(), staging_.size());
  return {};
}

}  // namespace dptrain::distributed
