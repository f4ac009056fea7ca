// The Communicator interface's shared checks.
#include "distributed/communicator.h"

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

}  // namespace dptrain::distributed
