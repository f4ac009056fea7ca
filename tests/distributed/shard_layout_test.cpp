// ShardLayout: ZeRO-1's partition against counts worked out by hand, the invariants for many
// window sizes and rank counts (every element owned by exactly one rank or kept by all), and its
// all-gather on the real communicator.
#include "distributed/shard_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "distributed/mpi_communicator.h"
#include "mpi_test_env.h"

namespace dptrain::distributed {
namespace {

TEST(ShardLayout, WorkedExampleWithTails) {
  // Windows of 48 and 35 elements (in launch order, the second one first in the buffer), 3 ranks:
  // chunks of 16 and 11; the second window keeps a tail of 2 on every rank.
  const std::vector<FlatRange> windows = {{40, 48}, {0, 35}};
  const ShardLayout rank0(windows, 3, 0), rank2(windows, 3, 2);
  EXPECT_EQ(rank0.chunk(0), 16);
  EXPECT_EQ(rank0.chunk(1), 11);
  EXPECT_EQ(rank0.scattered(1), (FlatRange{0, 33}));
  EXPECT_EQ(rank0.tail(1), (FlatRange{33, 2}));
  EXPECT_EQ(rank0.tail(0), (FlatRange{88, 0}));
  EXPECT_EQ(rank2.chunk_of(0, 2), (FlatRange{72, 16}));
  // Rank 0: [0, 11) of the first window in the buffer, its tail [33, 35), then [40, 56).
  EXPECT_EQ(rank0.owned(), (std::vector<FlatRange>{{0, 11}, {33, 2}, {40, 16}}));
  EXPECT_EQ(rank0.owned_elements(), 29);
  // Rank 2's chunk [22, 33) runs into the tail: merged. Then [72, 88).
  EXPECT_EQ(rank2.owned(), (std::vector<FlatRange>{{22, 13}, {72, 16}}));
}

TEST(ShardLayout, TwoOrFourRanksOverThePaddedLayoutHaveNoTails) {
  // Every window of the flat layout is a multiple of 16 floats.
  const std::vector<FlatRange> windows = {{0, 16}, {16, 4096}, {4112, 48}};
  for (int ranks : {1, 2, 4, 8, 16}) {
    const ShardLayout layout(windows, ranks, ranks - 1);
    int64_t owned = 0;
    for (std::size_t w = 0; w < windows.size(); ++w) {
      EXPECT_EQ(layout.tail(w).numel, 0) << ranks << " ranks, window " << w;
      owned += windows[w].numel / ranks;
    }
    EXPECT_EQ(layout.owned_elements(), owned) << ranks << " ranks";
  }
  // One rank owns everything, as one range.
  EXPECT_EQ(ShardLayout(windows, 1, 0).owned(), (std::vector<FlatRange>{{0, 4160}}));
}

TEST(ShardLayout, EveryElementIsOwnedByOneRankOrKeptByAll) {
  for (int ranks = 1; ranks <= 9; ++ranks)
    for (const std::vector<FlatRange>& windows :
         {std::vector<FlatRange>{{0, 1}}, {{5, 7}, {0, 5}}, {{0, 100}, {100, 3}, {200, 17}}}) {
      int64_t end = 0;
      for (const FlatRange& w : windows) end = std::max(end, w.end());
      std::vector<int> owners(static_cast<std::size_t>(end), 0);
      std::vector<bool> in_window(static_cast<std::size_t>(end), false);
      for (const FlatRange& w : windows)
        for (int64_t i = w.offset; i < w.end(); ++i) in_window[static_cast<std::size_t>(i)] = true;
      int64_t total = 0;
      for (int r = 0; r < ranks; ++r) {
        const ShardLayout layout(windows, ranks, r);
        total += layout.owned_elements();
        for (const FlatRange& range : layout.owned())
          for (int64_t i = range.offset; i < range.end(); ++i) ++owners[static_cast<std::size_t>(i)];
        for (std::size_t k = 1; k < layout.owned().size(); ++k)
          EXPECT_LT(layout.owned()[k - 1].end(), layout.owned()[k].offset) << "not merged or not in order";
      }
      int64_t kept_by_all = 0;
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if (!in_window[i]) {
          EXPECT_EQ(owners[i], 0) << "element " << i << " outside every window";
          continue;
        }
        EXPECT_TRUE(owners[i] == 1 || owners[i] == ranks)
            << "element " << i << ": " << owners[i] << " owners";
        if (owners[i] == ranks && ranks > 1) ++kept_by_all;
      }
      int64_t tails = 0;
      for (const FlatRange& w : windows) tails += w.numel % ranks;
      EXPECT_EQ(kept_by_all, ranks > 1 ? tails : 0) << ranks << " ranks";
      int64_t elements = 0;
      for (const FlatRange& w : windows) elements += w.numel;
      EXPECT_EQ(total, elements + (ranks - 1) * tails) << ranks << " ranks";
    }
}

TEST(ShardLayout, OverlappingWindowsAreRefused) {
  EXPECT_THROW(ShardLayout({{0, 10}, {5, 10}}, 2, 0), Error);
}

// Each rank fills its owned ranges with values only it knows; after the all-gather every rank holds
// every rank's.
TEST(ShardLayout, AllgatherMakesAPartitionedBufferWhole) {
  MpiCommunicator comm(test::world());
  const int ranks = test::size();
  const std::vector<FlatRange> windows = {{64, 4096}, {0, 64}, {4160, 16}};
  const ShardLayout layout(windows, ranks, test::rank());
  std::vector<float> flat(4176, -1.0f);
  const auto value = [](int64_t i) { return static_cast<float>(i) * 0.5f + 3.0f; };
  for (const FlatRange& r : layout.owned())
    for (int64_t i = r.offset; i < r.end(); ++i) flat[static_cast<std::size_t>(i)] = value(i);
  layout.allgather(comm, flat.data(), "test all-gather");
  for (std::size_t i = 0; i < flat.size(); ++i) ASSERT_EQ(flat[i], value(static_cast<int64_t>(i))) << i;
}

}  // namespace
}  // namespace dptrain::distributed
