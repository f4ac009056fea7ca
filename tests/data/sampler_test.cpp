// Tests for ShardedSampler: equal steps, disjoint shards, coverage, determinism.
#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "core/error.h"

using dptrain::data::ShardedSampler;

namespace {

using Batches = std::vector<std::vector<int64_t>>;  // [step] -> indices

Batches epoch_batches(const ShardedSampler& s) {
  Batches out;
  for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
    const auto b = s.batch_indices(step);
    out.emplace_back(b.begin(), b.end());
  }
  return out;
}

// [rank][step] -> indices for every rank of a world.
std::vector<Batches> world_batches(int64_t n, int64_t batch, int world, uint64_t seed, bool shuffle,
                                   bool drop_last, int64_t epoch) {
  std::vector<Batches> out;
  for (int r = 0; r < world; ++r) {
    ShardedSampler s(n, batch, r, world, seed, shuffle, drop_last);
    s.set_epoch(epoch);
    out.push_back(epoch_batches(s));
  }
  return out;
}

TEST(ShardedSampler, ShardsAreEqualLengthDisjointAndCovering) {
  for (int world = 1; world <= 7; ++world)
    for (int64_t n : {1, 7, 50, 101, 1000})
      for (int64_t batch : {1, 3, 32})
        for (bool drop_last : {false, true})
          for (bool shuffle : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "world=" << world << " n=" << n << " batch=" << batch
                                              << " drop_last=" << drop_last << " shuffle=" << shuffle);
            const int64_t g = batch * world;
            ShardedSampler rank0(n, batch, 0, world, 42, shuffle, drop_last);
            const auto all = world_batches(n, batch, world, 42, shuffle, drop_last, 3);
            const std::size_t steps = all[0].size();
            EXPECT_EQ(static_cast<int64_t>(steps), rank0.steps_per_epoch());
            if (drop_last) {
              EXPECT_EQ(static_cast<int64_t>(steps), n / g);
            } else if (n % g == 0 || n % g >= world || n < g) {
              EXPECT_EQ(static_cast<int64_t>(steps), (n + g - 1) / g);
            }

            std::vector<int64_t> seen;  // in (step, rank) order
            for (std::size_t step = 0; step < steps; ++step)
              for (int r = 0; r < world; ++r) {
                ASSERT_EQ(all[r].size(), steps) << "rank " << r << " runs a different number of steps";
                const auto& b = all[r][step];
                if (drop_last) {
                  EXPECT_EQ(static_cast<int64_t>(b.size()), batch);
                }
                if (!drop_last && n >= world) {
                  EXPECT_GE(b.size(), 1u) << "rank " << r << " step " << step;
                }
                EXPECT_LE(static_cast<int64_t>(b.size()), rank0.max_batch_size());
                seen.insert(seen.end(), b.begin(), b.end());
              }
            const std::set<int64_t> unique(seen.begin(), seen.end());
            EXPECT_EQ(unique.size(), seen.size()) << "a sample went to two places";
            for (int64_t i : seen) ASSERT_TRUE(i >= 0 && i < n);
            EXPECT_EQ(static_cast<int64_t>(seen.size()), drop_last ? (n / g) * g : n);
            if (!shuffle) {
              // Chunks are contiguous in rank order, so (step, rank) order is the permutation itself.
              std::vector<int64_t> expected(seen.size());
              std::iota(expected.begin(), expected.end(), int64_t{0});
              EXPECT_EQ(seen, expected);
            }
          }
}

TEST(ShardedSampler, OneRankWithBatchNBEqualsNRanksWithBatchB) {
  for (int world = 1; world <= 7; ++world)
    for (int64_t batch : {1, 3, 32})
      for (int64_t global_batches : {1, 2, 5})
        for (int64_t rem : {int64_t{0}, int64_t{world}, int64_t{world} + 1}) {
          // Divisible sizes, plus remainders large enough to give every rank a sample.
          const int64_t n = global_batches * batch * world + (rem < batch * world ? rem : 0);
          SCOPED_TRACE(::testing::Message() << "world=" << world << " batch=" << batch << " n=" << n);
          const auto shards = world_batches(n, batch, world, 7, true, false, 2);
          ShardedSampler single(n, batch * world, 0, 1, 7, true, false);
          single.set_epoch(2);
          const Batches big = epoch_batches(single);
          ASSERT_EQ(shards[0].size(), big.size());
          for (std::size_t step = 0; step < big.size(); ++step) {
            std::vector<int64_t> joined;
            for (int r = 0; r < world; ++r)
              joined.insert(joined.end(), shards[r][step].begin(), shards[r][step].end());
            EXPECT_EQ(joined, big[step]) << "step " << step;
          }
        }
}

// Resuming an epoch where a checkpoint left it (same world and batch) replays the straight run's
// remaining steps exactly, whatever the tail rule did.
TEST(ShardedSampler, ResumingAtAStepBoundaryReplaysTheRemainingSteps) {
  for (int world = 1; world <= 5; ++world)
    for (int64_t n : {7, 50, 101})
      for (int64_t batch : {1, 3, 8})
        for (bool drop_last : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "world=" << world << " n=" << n << " batch=" << batch
                                            << " drop_last=" << drop_last);
          for (int r = 0; r < world; ++r) {
            ShardedSampler straight(n, batch, r, world, 5, true, drop_last);
            straight.set_epoch(1);
            const Batches whole = epoch_batches(straight);
            EXPECT_EQ(straight.samples_before(0), 0);
            for (int64_t k = 1; k < straight.steps_per_epoch(); ++k) {
              ShardedSampler resumed(n, batch, r, world, 5, true, drop_last);
              resumed.set_epoch(1, straight.samples_before(k));
              EXPECT_EQ(epoch_batches(resumed), Batches(whole.begin() + k, whole.end()))
                  << "resumed at step " << k;
              EXPECT_EQ(resumed.samples_before(resumed.steps_per_epoch()),
                        straight.samples_before(straight.steps_per_epoch()));
            }
          }
        }
}

// On another world size or batch, the epoch continues from the same sample: together the ranks see
// exactly the permutation positions [first, n), each once.
TEST(ShardedSampler, ResumingOnAnotherWorldSizeCoversTheRestOfTheEpochOnce) {
  ShardedSampler written(1000, 32, 0, 2, 11, true, false);
  written.set_epoch(4);
  std::vector<int64_t> order;
  for (int64_t s = 0; s < written.steps_per_epoch(); ++s)
    for (int r = 0; r < 2; ++r) {
      ShardedSampler rank(1000, 32, r, 2, 11, true, false);
      rank.set_epoch(4);
      const auto b = rank.batch_indices(s);
      order.insert(order.end(), b.begin(), b.end());
    }
  for (int world : {1, 3, 4})
    for (int64_t first : {64, 320, 999}) {
      std::vector<int64_t> seen;
      int64_t steps = -1;
      for (int r = 0; r < world; ++r) {
        ShardedSampler s(1000, 20, r, world, 11, true, false);
        s.set_epoch(4, first);
        if (steps < 0) steps = s.steps_per_epoch();
        EXPECT_EQ(s.steps_per_epoch(), steps);
        EXPECT_EQ(s.samples_before(0), first);
        EXPECT_EQ(s.samples_before(s.steps_per_epoch()), 1000);
      }
      for (int64_t step = 0; step < steps; ++step)
        for (int r = 0; r < world; ++r) {
          ShardedSampler s(1000, 20, r, world, 11, true, false);
          s.set_epoch(4, first);
          const auto b = s.batch_indices(step);
          seen.insert(seen.end(), b.begin(), b.end());
        }
      EXPECT_EQ(seen, std::vector<int64_t>(order.begin() + first, order.end()))
          << "world " << world << " first " << first;
    }
  ShardedSampler s(1000, 20, 0, 1, 11, true, false);
  EXPECT_THROW(s.set_epoch(0, 1000), dptrain::Error);
  EXPECT_THROW(s.set_epoch(0, -1), dptrain::Error);
}

TEST(ShardedSampler, DeterministicPerSeedAndEpoch) {
  ShardedSampler a(1000, 32, 1, 3, 123, true, false), b(1000, 32, 1, 3, 123, true, false);
  a.set_epoch(5);
  b.set_epoch(0);
  b.set_epoch(5);  // the order depends on (seed, epoch) only, not on history
  EXPECT_EQ(epoch_batches(a), epoch_batches(b));
  EXPECT_EQ(a.epoch(), 5);

  const Batches e5 = epoch_batches(a);
  a.set_epoch(6);
  EXPECT_NE(epoch_batches(a), e5);

  ShardedSampler other_seed(1000, 32, 1, 3, 124, true, false);
  other_seed.set_epoch(5);
  EXPECT_NE(epoch_batches(other_seed), e5);
}

TEST(ShardedSampler, ShuffleIsAPermutationAndNotIdentity) {
  ShardedSampler s(1000, 1000, 0, 1, 9, true, false);
  s.set_epoch(0);
  const auto b = s.batch_indices(0);
  std::vector<int64_t> v(b.begin(), b.end());
  std::vector<int64_t> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(v, identity);
}

TEST(ShardedSampler, TailRule) {
  // n=7, B=3, W=2: g=6, rem=1 < W -> last full batch and remainder (7) split 4 + 3.
  auto all = world_batches(7, 3, 2, 0, false, false, 0);
  EXPECT_EQ(all[0], (Batches{{0, 1}, {4, 5}}));
  EXPECT_EQ(all[1], (Batches{{2, 3}, {6}}));
  // n=7, B=1, W=2: no split can keep 4 steps non-empty on both ranks -> 3 steps, last of 3 samples.
  all = world_batches(7, 1, 2, 0, false, false, 0);
  EXPECT_EQ(all[0], (Batches{{0}, {2}, {4, 5}}));
  EXPECT_EQ(all[1], (Batches{{1}, {3}, {6}}));
  EXPECT_EQ(ShardedSampler(7, 1, 0, 2, 0, false, false).max_batch_size(), 2);
  // n=20, B=3, W=3: g=9, rem=2 < W -> steps of 9, then 11 split 6 + 5.
  all = world_batches(20, 3, 3, 0, false, false, 0);
  EXPECT_EQ(all[2], (Batches{{6, 7, 8}, {13, 14}, {19}}));
  // n=2 < W=3: one step, rank 2 empty (unavoidable).
  all = world_batches(2, 4, 3, 0, false, false, 0);
  EXPECT_EQ(all[2], (Batches{{}}));
}

TEST(ShardedSampler, RejectsMisuse) {
  ShardedSampler s(10, 2, 0, 1, 0, true, false);
  EXPECT_THROW(s.batch_indices(0), dptrain::Error);  // before set_epoch
  s.set_epoch(0);
  EXPECT_THROW(s.batch_indices(5), dptrain::Error);
  EXPECT_THROW(s.batch_indices(-1), dptrain::Error);
  EXPECT_THROW(ShardedSampler(10, 2, 2, 2, 0, true, false), dptrain::Error);
  EXPECT_THROW(ShardedSampler(0, 2, 0, 1, 0, true, false), dptrain::Error);
  EXPECT_THROW(ShardedSampler(10, 0, 0, 1, 0, true, false), dptrain::Error);
}

// Micro-batch mode: for one global batch G split as W ranks x G/W, every step's micro-batches (the
// samples in order, cut every `micro`) are the same for every W, each rank holds a contiguous run
// of whole micro-batches, and the tail is one step whatever W. Some ranks hold nothing there.
TEST(ShardedSampler, MicroBatchesAreTheSameForEveryWorldSize) {
  for (const bool drop_last : {false, true}) {
    for (const int64_t n : {1000, 1024, 77}) {
      const int64_t global = 128, micro = 16;
      std::vector<std::vector<int64_t>> reference;  // micro-batches of the whole epoch, from W = 1
      for (const int world : {1, 2, 4, 8}) {
        std::vector<std::vector<int64_t>> micro_batches;
        int64_t steps = -1;
        std::vector<ShardedSampler> ranks;
        for (int r = 0; r < world; ++r) {
          ranks.emplace_back(n, global / world, r, world, 5, true, drop_last, micro);
          ranks.back().set_epoch(3);
          if (steps < 0) steps = ranks.back().steps_per_epoch();
          ASSERT_EQ(ranks.back().steps_per_epoch(), steps);
        }
        EXPECT_EQ(steps, drop_last ? n / global : (n + global - 1) / global) << "n " << n << " W " << world;
        for (int64_t step = 0; step < steps; ++step) {
          int64_t next_micro = 0;
          for (int r = 0; r < world; ++r) {
            const ShardedSampler& s = ranks[static_cast<std::size_t>(r)];
            const auto mine = s.batch_indices(step);
            EXPECT_EQ(s.first_micro_batch(step), next_micro) << "contiguous, rank " << r;
            for (std::size_t i = 0; i < mine.size(); i += micro) {
              const std::size_t end = std::min(mine.size(), i + micro);
              micro_batches.emplace_back(mine.begin() + static_cast<std::ptrdiff_t>(i),
                                         mine.begin() + static_cast<std::ptrdiff_t>(end));
              ++next_micro;
            }
          }
          EXPECT_EQ(next_micro, ranks[0].micro_batches(step)) << "step " << step << " W " << world;
        }
        if (world == 1) reference = micro_batches;
        EXPECT_EQ(micro_batches, reference) << "n " << n << " W " << world << " drop_last " << drop_last;
      }
    }
  }
  // 104 samples in the tail step: 7 micro-batches over 8 ranks, so rank 0 gets none.
  ShardedSampler tail(1000, 16, 0, 8, 5, true, false, 16);
  tail.set_epoch(0);
  EXPECT_EQ(tail.micro_batches(7), 7);
  EXPECT_TRUE(tail.batch_indices(7).empty());
  EXPECT_THROW(ShardedSampler(1000, 24, 0, 2, 5, true, false, 16), dptrain::Error);  // 16 does not divide 24
}

}  // namespace
