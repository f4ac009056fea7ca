// Start-up agreement: broadcast parameters, optimizer state and counters from rank 0, then prove
// every rank holds the same parameters with a checksum compared across ranks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

// Overwrites every tensor's data and every scalar with rank 0's, in the given order (the same on all
// ranks). Shapes must already agree; a mismatch is caught by comparing element counts first.
void broadcast_state(Communicator& comm, const std::vector<NamedTensor>& parameters,
                     const std::vector<NamedTensor>& optimizer_state, std::span<int64_t> scalars);

// FNV-1a over the parameters' bytes on each rank, gathered and compared. Returns the checksum;
// throws naming the ranks that differ from rank 0.
uint64_t verify_identical(Communicator& comm, const std::vector<NamedTensor>& parameters);

}  // namespace dptrain::distributed
