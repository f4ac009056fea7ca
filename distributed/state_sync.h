// Start-up agreement: broadcast parameters, optimizer state and counters from rank 0, then prove
// every rank holds the same parameters with a checksum compared across ranks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

// Overwrites every buffer's elements and every scalar with rank 0's, in the given order (the same
// on all ranks): the flat parameter buffer and the optimizer's flat state buffers. A rank whose
// buffers or scalars differ in number or size from rank 0's (another config) is caught before any
// data moves, and every rank throws: that rank naming its layout, the others naming that rank.
// `host` carries that check and the scalars (host memory), `device` the buffers (on a GPU, its
// communicator; on the CPU the same one).
void broadcast_state(Communicator& host, Communicator& device, const std::vector<Tensor>& buffers,
                     std::span<int64_t> scalars);
inline void broadcast_state(Communicator& comm, const std::vector<Tensor>& buffers,
                            std::span<int64_t> scalars) {
  broadcast_state(comm, comm, buffers, scalars);
}

// FNV-1a over the parameters' bytes on each rank, gathered and compared. Returns the checksum;
// throws naming the ranks that differ from rank 0.
uint64_t verify_identical(Communicator& comm, const std::vector<NamedTensor>& parameters);

}  // namespace dptrain::distributed
