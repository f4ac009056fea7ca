// Broadcast of model and optimizer state, and the cross-rank checksum.
#include "distributed/state_sync.h"

#include "core/error.h"

namespace dptrain::distributed {

void broadcast_state(Communicator& host, Communicator& device, const std::vector<Tensor>& buffers,
                     std::span<int64_t> scalars) {
  if (host.size() == 1) return;
  // Agree on the layout before moving data: a rank with another model would otherwise corrupt memory.
  int64_t total = 0;
  for (const Tensor& t : buffers) total += t.numel();
  int64_t layout[2] = {total, static_cast<int64_t>(buffers.size())};
  int64_t root_layout[2] = {layout[0], layout[1]};
  host.broadcast(std::span<int64_t>(root_layout), 0, "broadcast of the state layout");
  DPTRAIN_CHECK(root_layout[0] == layout[0] && root_layout[1] == layout[1], "rank ", host.rank(), " has ",
                layout[1], " state buffers with ", layout[0], " elements but rank 0 has ", root_layout[1],
                " with ", root_layout[0], "; all ranks must run the same config");
  for (const Tensor& t : buffers)
    device.broadcast(std::span<float>(t.data_ptr(), static_cast<std::size_t>(t.numel())), 0,
                     "broadcast of parameters and optimizer state");
  host.broadcast(scalars, 0, "broadcast of optimizer counters");
}

uint64_t verify_identical(Communicator& comm, const std::vector<NamedTensor>& parameters) {
  uint64_t hash = 14695981039346656037ull;
  for (const NamedTensor& p : parameters) {
    const std::vector<float> values = p.tensor.to_vector();
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    for (std::size_t i = 0; i < values.size() * sizeof(float); ++i)
      hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  std::vector<uint64_t> all(comm.size());
  comm.allgather(std::span<const uint64_t>(&hash, 1), std::span<uint64_t>(all),
                 "allgather of parameter checksums");
  std::string differing;
  for (int r = 1; r < comm.size(); ++r)
    if (all[r] != all[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  DPTRAIN_CHECK(differing.empty(), "parameters differ from rank 0's on rank(s) ", differing,
                " after the broadcast");
  return hash;
}

}  // namespace dptrain::distributed
