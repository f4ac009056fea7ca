// ZeRO-1's partition of the flat buffers, and the all-gather that makes a partitioned buffer whole.
#include "distributed/shard_layout.h"

#include <algorithm>

#include "core/error.h"

namespace dptrain::distributed {

ShardLayout::ShardLayout(std::vector<FlatRange> windows, int ranks, int rank)
    : windows_(std::move(windows)), ranks_(ranks), rank_(rank) {
  DPTRAIN_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "shard layout: rank ", rank, " of ", ranks);
  const auto add = [&](FlatRange r) {
    if (r.numel == 0) return;
    if (!owned_.empty() && owned_.back().end() == r.offset)
      owned_.back().numel += r.numel;
    else
      owned_.push_back(r);
    owned_elements_ += r.numel;
  };
  std::vector<std::size_t> order(windows_.size());
  for (std::size_t w = 0; w < order.size(); ++w) order[w] = w;
  std::ranges::sort(order, {}, [&](std::size_t w) { return windows_[w].offset; });
  for (std::size_t k = 0; k < order.size(); ++k)
    DPTRAIN_CHECK(windows_[order[k]].numel >= 0 &&
                      (k == 0 || windows_[order[k - 1]].end() <= windows_[order[k]].offset),
                  "shard layout: windows overlap at element ", windows_[order[k]].offset);
  // In flat order: the optimizer's state is laid out in it.
  for (const std::size_t w : order) {
    add(chunk_of(w, rank_));
    add(tail(w));
  }
}

void ShardLayout::allgather(Communicator& comm, float* flat, const std::string& what) const {
  if (ranks_ == 1) return;
  std::vector<Pending> pending;
  for (std::size_t w = 0; w < windows_.size(); ++w)
    if (chunk(w) > 0)
      pending.push_back(comm.start_allgather_in_place(
          std::span<float>(flat + windows_[w].offset, static_cast<std::size_t>(scattered(w).numel)),
          what + " (window " + std::to_string(w) + " of " + std::to_string(windows_.size()) + ")"));
  for (Pending& p : pending) comm.wait(p);
}

}  // namespace dptrain::distributed
