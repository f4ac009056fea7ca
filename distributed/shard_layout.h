// ShardLayout: ZeRO-1's partition of the flat parameter buffers among the ranks
// (distributed.shard_optimizer). Each window (a gradient bucket: the range one collective covers) is
// cut into size() equal chunks, and chunk r of every window is rank r's: the window's reduce-scatter
// leaves the average there, rank r's optimizer updates it with the only copy of its state, and an
// all-gather of the window hands the new values to every rank. A window whose length is not a
// multiple of the ranks keeps a tail of fewer than size() elements that is allreduced and updated
// alike on every rank; the flat layout pads each parameter to 16 floats, so with 2, 4, 8 or 16 ranks
// there is none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/parameters.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

class ShardLayout {
 public:
  // `windows`: disjoint ranges of the flat buffers, in the order the collectives run.
  ShardLayout(std::vector<FlatRange> windows, int ranks, int rank);

  std::size_t windows() const { return windows_.size(); }
  // The part of window w that is reduce-scattered and all-gathered: size() chunks of chunk(w).
  FlatRange scattered(std::size_t w) const { return {windows_[w].offset, chunk(w) * ranks_}; }
  int64_t chunk(std::size_t w) const { return windows_[w].numel / ranks_; }
  // Rank r's chunk of window w.
  FlatRange chunk_of(std::size_t w, int r) const { return {windows_[w].offset + chunk(w) * r, chunk(w)}; }
  // What is left of window w past its chunks: allreduced, kept on every rank.
  FlatRange tail(std::size_t w) const { return {scattered(w).end(), windows_[w].numel % ranks_}; }

  // The ranges this rank updates: its chunk of each window and every tail, adjacent ones merged, in
  // the order of the flat buffers. What the optimizer keeps state for.
  const std::vector<FlatRange>& owned() const { return owned_; }
  int64_t owned_elements() const { return owned_elements_; }

  // Collective: a flat buffer (the parameters' layout) in which each rank has filled its owned
  // ranges becomes whole on every rank (one in-place all-gather per window, started together).
  void allgather(Communicator& comm, float* flat, const std::string& what) const;

 private:
  std::vector<FlatRange> windows_;
  int ranks_, rank_;
  std::vector<FlatRange> owned_;
  int64_t owned_elements_ = 0;
};

}  // namespace dptrain::distributed
