// Broadcast of model and optimizer state, and the cross-rank checksum.
#include "distributed/state_sync.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dptrain::distributed {

void broadcast_state(Communicator& host, Communicator& device, const std::vector<Tensor>& buffers,
                     std::span<int64_t> scalars) {
  if (host.size() == 1) return;
  // Agree on the layout before moving data: a rank with another model would otherwise corrupt memory,
  // or pair its broadcasts with other buffers than rank 0's (an empty one makes no call at all). Every
  // rank learns whether any differs, so all of them stop rather than some wait in a broadcast.
  int64_t total = 0;
  uint64_t sizes = 14695981039346656037ull;  // FNV-1a over the buffers' sizes, in order
  for (const Tensor& t : buffers) {
    total += t.numel();
    sizes = (sizes ^ static_cast<uint64_t>(t.numel())) * 1099511628211ull;
  }
  const int64_t layout[4] = {static_cast<int64_t>(buffers.size()), total,
                             static_cast<int64_t>(scalars.size()), static_cast<int64_t>(sizes)};
  int64_t root_layout[4] = {layout[0], layout[1], layout[2], layout[3]};
  host.broadcast(std::span<int64_t>(root_layout), 0, "broadcast of the state layout");
  const bool mine_differs = !std::equal(layout, layout + 4, root_layout);
  std::vector<int64_t> differs(static_cast<std::size_t>(host.size()));
  const int64_t flag = mine_differs;
  host.allgather(std::span<const int64_t>(&flag, 1), std::span<int64_t>(differs),
                 "allgather of the state layout's agreement");
  DPTRAIN_CHECK(!mine_differs, "rank ", host.rank(), " has ", layout[0], " state buffers of ", layout[1],
                " elements and ", layout[2], " counter(s), rank 0 ", root_layout[0], " of ", root_layout[1],
                " and ", root_layout[2],
                layout[0] == root_layout[0] && layout[1] == root_layout[1] && layout[3] != root_layout[3]
                    ? " (the buffers' sizes differ)"
                    : "",
                "; all ranks must run the same config");
  std::string differing;
  for (std::size_t r = 0; r < differs.size(); ++r)
    if (differs[r] != 0) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  DPTRAIN_CHECK(differing.empty(), "rank(s) ", differing,
                " hold state buffers laid out otherwise than rank 0's (their lines say how); all ranks "
                "must run the same config");
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
