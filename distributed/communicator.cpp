// The Communicator interface's shared checks.
#include "distributed/communicator.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace dptrain::distributed {

void Communicator::check_allgather_sizes(std::size_t send, std::size_t recv) const {
  DPTRAIN_CHECK(recv == send * static_cast<std::size_t>(size()), "allgather: receive buffer of ", recv,
                " elements for ", send, " x ", size(), " ranks");
}

std::size_t Communicator::chunk_of(std::size_t count, const char* collective, const std::string& what) const {
  const auto ranks = static_cast<std::size_t>(size());
  DPTRAIN_CHECK(count % ranks == 0, collective, " of ", count, " elements over ", ranks,
                " ranks: not a multiple of the ranks (", what, "); pad the buffer to one");
  return count / ranks;
}

void Communicator::check_rooted_sizes(const char* collective, std::size_t each, std::size_t whole, int root,
                                      const std::string& what) const {
  DPTRAIN_CHECK(root >= 0 && root < size(), collective, ": root ", root, " is not a rank of ", size(), " (",
                what, ")");
  DPTRAIN_CHECK(rank() != root || whole == each * static_cast<std::size_t>(size()), collective, ": ", whole,
                " elements on the root for ", each, " x ", size(), " ranks (", what, ")");
}

// The defaults pass rows through host memory: a communicator of device buffers has to bring its own.
void Communicator::gather_elements(const void* send, void* recv, std::size_t count, DataType type, int root,
                                   const std::string& what) {
  DPTRAIN_CHECK(accepts(Device::cpu()), "gather of ", what,
                ": this communicator moves device buffers and has no gather of its own (host memory only)");
  gather_by_broadcasts(*this, send, recv, count, type, root, what);
}

void Communicator::scatter_elements(const void* send, void* recv, std::size_t count, DataType type, int root,
                                    const std::string& what) {
  DPTRAIN_CHECK(accepts(Device::cpu()), "scatter of ", what,
                ": this communicator moves device buffers and has no scatter of its own (host memory only)");
  scatter_by_broadcasts(*this, send, recv, count, type, root, what);
}

namespace {

// Rank r's `count` elements of `type` in a buffer `at` of r * count of them.
void* row_of(const void* at, int r, std::size_t count, DataType type) {
  return static_cast<char*>(const_cast<void*>(at)) + static_cast<std::size_t>(r) * count * element_size(type);
}

}  // namespace

void gather_by_broadcasts(Communicator& comm, const void* send, void* recv, std::size_t count, DataType type,
                          int root, const std::string& what) {
  const std::size_t bytes = count * element_size(type);
  std::vector<std::byte> passing(comm.rank() == root ? 0 : bytes);
  for (int r = 0; r < comm.size(); ++r) {
    // A broadcast's root only reads its buffer: the sender's own elements go out in place.
    void* row = comm.rank() == root ? row_of(recv, r, count, type)
                : comm.rank() == r  ? const_cast<void*>(send)
                                    : passing.data();
    if (comm.rank() == root && r == root && bytes > 0) std::memcpy(row, send, bytes);
    comm.broadcast_elements(row, count, type, r, what);
  }
}

void scatter_by_broadcasts(Communicator& comm, const void* send, void* recv, std::size_t count, DataType type,
                           int root, const std::string& what) {
  const std::size_t bytes = count * element_size(type);
  std::vector<std::byte> passing(comm.rank() == root ? 0 : bytes);
  for (int r = 0; r < comm.size(); ++r) {
    void* row = comm.rank() == root ? row_of(send, r, count, type) : comm.rank() == r ? recv : passing.data();
    comm.broadcast_elements(row, count, type, root, what);
    if (comm.rank() == root && r == root && bytes > 0) std::memcpy(recv, row, bytes);
  }
}

}  // namespace dptrain::distributed
