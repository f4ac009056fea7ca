// The Communicator interface's shared checks.
#include "distributed/communicator.h"

#include "core/error.h"

namespace dptrain::distributed {

void Communicator::check_allgather_sizes(std::size_t send, std::size_t recv) const {
  DPTRAIN_CHECK(recv == send * static_cast<std::size_t>(size()), "allgather: receive buffer of ", recv,
                " elements for ", send, " x ", size(), " ranks");
}

}  // namespace dptrain::distributed
