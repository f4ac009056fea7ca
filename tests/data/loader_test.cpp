// Tests for BatchLoader and augmentation: batches in list order with any number of workers and any
// read-ahead, per-channel normalisation by its formula, crop and flip against hand-made images, and
// bad samples (an error naming the sample, or replaced by the next good one and counted).
#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "tests/test_util.h"

namespace dptrain::data {
namespace {

// Sample i of a C x H x W data set holds 100 i + its element index; label i % 7; target -i.
InMemoryDataset numbered(int64_t samples, Shape shape, bool is_image, bool with_targets = false) {
  const int64_t numel = shape_numel(shape);
  std::vector<float> inputs, targets;
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < samples; ++i) {
    for (int64_t e = 0; e < numel; ++e) inputs.push_back(static_cast<float>(100 * i + e));
    labels.push_back(static_cast<int32_t>(i % 7));
    if (with_targets) targets.push_back(static_cast<float>(-i));
  }
  return InMemoryDataset(shape, inputs, labels, 7, targets, is_image);
}

struct Read {
  std::vector<float> inputs, targets;
  std::vector<int32_t> labels;
  bool operator==(const Read&) const = default;
};

std::vector<Read> read_all(BatchLoader& loader, int64_t epoch,
                           const std::vector<std::vector<int64_t>>& batches) {
  std::vector<std::span<const int64_t>> spans(batches.begin(), batches.end());
  loader.start(epoch, spans);
  std::vector<Read> out;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const BatchView view = loader.take();
    EXPECT_EQ(view.samples, static_cast<int64_t>(batches[b].size()));
    out.push_back({{view.inputs.begin(), view.inputs.end()},
                   {view.targets.begin(), view.targets.end()},
                   {view.labels.begin(), view.labels.end()}});
  }
  return out;
}

const std::vector<std::vector<int64_t>> kBatches = {{3, 1}, {0}, {4, 2, 5}, {}, {6, 7}, {1, 1}};

TEST(BatchLoader, GathersTheListedSamplesInOrderWithAnyWorkersAndReadAhead) {
  const InMemoryDataset ds = numbered(8, {2}, /*is_image=*/false, /*with_targets=*/true);
  std::vector<Read> expected;
  for (const auto& batch : kBatches) {
    Read r;
    for (const int64_t i : batch) {
      r.inputs.insert(r.inputs.end(), {static_cast<float>(100 * i), static_cast<float>(100 * i + 1)});
      r.labels.push_back(static_cast<int32_t>(i % 7));
      r.targets.push_back(static_cast<float>(-i));
    }
    expected.push_back(r);
  }
  for (const int workers : {0, 1, 3})
    for (const int prefetch : {1, 2, 5}) {
      BatchLoader loader(ds, {.workers = workers, .prefetch = prefetch});
      EXPECT_EQ(loader.workers(), workers);
      EXPECT_EQ(read_all(loader, 0, kBatches), expected) << workers << " workers, prefetch " << prefetch;
      // A second start, before the first list is used up, drops what was read ahead.
      loader.start(1, {kBatches[2]});
      static_cast<void>(loader.take());
      EXPECT_EQ(read_all(loader, 2, kBatches), expected);
    }
}

// What a GPU's in-place upload needs: the inputs live in SlotMemory's blocks, and a batch's slot is
// filled again only after wait_for_readers(), here an asynchronous reader that checks, when asked to
// finish, that the batches it still reads are unchanged.
TEST(BatchLoader, InputsLiveInSlotMemoryAndASlotIsRefilledOnlyAfterItsReadersFinish) {
  const InMemoryDataset ds = numbered(8, {3}, /*is_image=*/false);
  for (const int workers : {0, 1, 3})
    for (const int prefetch : {1, 2}) {
      std::map<void*, std::size_t> blocks;
      int released = 0, waits = 0;
      struct Reading {
        std::span<const float> memory;
        std::vector<float> when_taken;
      };
      std::vector<Reading> reading;
      const SlotMemory memory{.allocate =
                                  [&](std::size_t bytes) {
                                    void* p = ::operator new (bytes, std::align_val_t{64});
                                    blocks[p] = bytes;
                                    return p;
                                  },
                              .release =
                                  [&](void* p) {
                                    EXPECT_EQ(blocks.erase(p), 1u);
                                    ::operator delete (p, std::align_val_t{64});
                                    ++released;
                                  },
                              .wait_for_readers =
                                  [&] {
                                    ++waits;
                                    for (const Reading& r : reading)
                                      EXPECT_TRUE(std::equal(r.memory.begin(), r.memory.end(),
                                                             r.when_taken.begin(), r.when_taken.end()))
                                          << "a slot was filled again while its batch was still read";
                                    reading.clear();
                                  }};
      {
        BatchLoader loader(ds, {.workers = workers, .prefetch = prefetch, .slot_memory = memory});
        for (int64_t epoch = 0; epoch < 2; ++epoch) {
          std::vector<std::span<const int64_t>> spans(kBatches.begin(), kBatches.end());
          loader.start(epoch, spans);
          for (std::size_t b = 0; b < kBatches.size(); ++b) {
            const BatchView view = loader.take();
            EXPECT_TRUE(reading.empty()) << "batch " << b << " taken before the one before was waited for";
            if (!view.inputs.empty()) {
              auto block = blocks.upper_bound(const_cast<float*>(view.inputs.data()));
              ASSERT_NE(block, blocks.begin()) << "the inputs are not in SlotMemory's memory";
              --block;
              EXPECT_LE(reinterpret_cast<const char*>(view.inputs.data() + view.inputs.size()),
                        static_cast<const char*>(block->first) + block->second);
            }
            for (std::size_t i = 0; i < view.inputs.size(); ++i)
              EXPECT_EQ(view.inputs[i],
                        100.0f * static_cast<float>(kBatches[b][i / 3]) + static_cast<float>(i % 3));
            reading.push_back({view.inputs, {view.inputs.begin(), view.inputs.end()}});
          }
        }
        EXPECT_GE(waits, 2 * static_cast<int>(kBatches.size()) - 1);
      }
      EXPECT_TRUE(blocks.empty()) << blocks.size() << " block(s) never released";
      EXPECT_GE(released, 1);
    }
  // Memory from one allocator freed by another would be undefined: both or neither.
  const SlotMemory half{.allocate = [](std::size_t bytes) { return ::operator new(bytes); },
                        .release = nullptr,
                        .wait_for_readers = nullptr};
  test_util::expect_error([&] { BatchLoader loader(ds, {.workers = 1, .slot_memory = half}); },
                          {"SlotMemory needs both allocate and release"});
}

TEST(BatchLoader, TakingPastTheListIsAnError) {
  const InMemoryDataset ds = numbered(4, {1}, false);
  BatchLoader loader(ds, {.workers = 2});
  const std::vector<int64_t> batch = {0, 1};
  loader.start(0, {batch});
  static_cast<void>(loader.take());
  test_util::expect_error([&] { loader.take(); }, {"batch 1 taken, but start() gave 1"});
}

TEST(BatchLoader, NormalisesImagesPerChannelByTheFormula) {
  const InMemoryDataset ds = numbered(2, {2, 1, 2}, /*is_image=*/true);
  BatchLoader loader(ds, {.workers = 1, .mean = {0.5f, 2.0f}, .std = {0.25f, 3.0f}});
  const std::vector<Read> got = read_all(loader, 0, {{1}});
  // Sample 1 holds 100..103: channel 0 is {100, 101}, channel 1 is {102, 103}.
  EXPECT_EQ(got[0].inputs, (std::vector<float>{(100.0f - 0.5f) / 0.25f, (101.0f - 0.5f) / 0.25f,
                                               (102.0f - 2.0f) / 3.0f, (103.0f - 2.0f) / 3.0f}));
  BatchLoader one_value(ds, {.mean = {1.0f}, .std = {2.0f}});
  EXPECT_EQ(
      read_all(one_value, 0, {{0}})[0].inputs,
      (std::vector<float>{-0.5f, 0.0f, 0.5f, 1.0f}));  // sample 0 holds 0..3: (x - 1) / 2 on both channels
  const InMemoryDataset features = numbered(1, {2}, /*is_image=*/false);
  BatchLoader untouched(features, {.mean = {1.0f}, .std = {2.0f}});
  EXPECT_EQ(read_all(untouched, 0, {{0}})[0].inputs, (std::vector<float>{0, 1}));
  test_util::expect_error(
      [&] {
        BatchLoader(ds, {.mean = {0, 0, 0}});
      },
      {"data.mean and data.std", "one per channel (2 here)", "got 3"});
  test_util::expect_error([&] { BatchLoader(ds, {.std = {0.0f}}); }, {"data.std must be positive"});
}

// Padding 0 without a flip is no augmentation, and needs no image; any other needs [C, H, W].
TEST(BatchLoader, AugmentationNeedsImagesOnlyWhenOn) {
  const InMemoryDataset features = numbered(1, {2}, /*is_image=*/false);
  BatchLoader off(features, {.augmentation = {.crop_padding = 0}});
  EXPECT_EQ(read_all(off, 0, {{0}})[0].inputs, (std::vector<float>{0, 1}));
  test_util::expect_error([&] { BatchLoader(features, {.augmentation = {.horizontal_flip = true}}); },
                          {"data.augment", "need [C, H, W] samples, these are [2]"});
  test_util::expect_error([&] { BatchLoader(features, {.augmentation = {.crop_padding = 1}}); },
                          {"need [C, H, W] samples"});
}

// A 1 x 3 x 3 image 1..9, padded by 1: each crop is the image shifted by (dy, dx) in [-1, 1]^2 with
// black where it leaves the image.
TEST(Augmentation, CropIsAShiftWithBlackBordersAndEveryOffsetOccurs) {
  const std::vector<float> image = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::set<std::pair<int, int>> offsets;
  for (uint64_t key = 0; key < 200; ++key) {
    std::vector<float> out(9);
    augment_sample({.crop_padding = 1}, {1, 3, 3}, key, image.data(), out.data());
    bool matched = false;
    for (int dy = -1; dy <= 1 && !matched; ++dy)
      for (int dx = -1; dx <= 1 && !matched; ++dx) {
        std::vector<float> shifted(9);
        for (int y = 0; y < 3; ++y)
          for (int x = 0; x < 3; ++x) {
            const int sy = y + dy, sx = x + dx;
            shifted[y * 3 + x] = sy >= 0 && sy < 3 && sx >= 0 && sx < 3 ? image[sy * 3 + sx] : 0.0f;
          }
        if (shifted == out) {
          matched = true;
          offsets.insert({dy, dx});
        }
      }
    EXPECT_TRUE(matched) << "key " << key;
  }
  EXPECT_EQ(offsets.size(), 9u);
}

TEST(Augmentation, FlipMirrorsRowsAboutHalfTheTime) {
  const std::vector<float> image = {1, 2, 3, 4, 5, 6};  // 2 channels of 1 x 3
  int flipped = 0;
  for (uint64_t key = 0; key < 1000; ++key) {
    std::vector<float> out(6);
    augment_sample({.horizontal_flip = true}, {2, 1, 3}, key, image.data(), out.data());
    if (out == std::vector<float>{3, 2, 1, 6, 5, 4})
      ++flipped;
    else
      EXPECT_EQ(out, image);
  }
  EXPECT_GT(flipped, 440);  // binomial(1000, 1/2): 5 standard deviations either side
  EXPECT_LT(flipped, 560);
}

TEST(Augmentation, KeyedBySeedEpochAndSampleOnly) {
  EXPECT_EQ(augmentation_key(1, 2, 3), augmentation_key(1, 2, 3));
  const std::set<uint64_t> keys = {augmentation_key(1, 2, 3), augmentation_key(2, 2, 3),
                                   augmentation_key(1, 3, 3), augmentation_key(1, 2, 4),
                                   augmentation_key(1, 3, 2)};
  EXPECT_EQ(keys.size(), 5u);
  // The loader's output is the same whichever workers read the samples.
  const InMemoryDataset ds = numbered(16, {1, 4, 4}, /*is_image=*/true);
  const std::vector<std::vector<int64_t>> batches = {{0, 1, 2, 3, 4, 5, 6},
                                                     {7, 8, 9, 10, 11, 12, 13, 14, 15}};
  const Augmentation both{.crop_padding = 2, .horizontal_flip = true};
  BatchLoader inline_loader(ds, {.workers = 0, .augmentation = both, .seed = 9});
  BatchLoader threaded(ds, {.workers = 3, .prefetch = 1, .augmentation = both, .seed = 9});
  const std::vector<Read> a = read_all(inline_loader, 4, batches);
  EXPECT_EQ(a, read_all(threaded, 4, batches));
  EXPECT_NE(a, read_all(threaded, 5, batches));  // another epoch, other crops
  // Sample 8, the second batch's second, is augment_sample with its own key.
  std::vector<float> sample(16), out(16);
  ds.read(8, sample.data(), nullptr);
  augment_sample(both, {1, 4, 4}, augmentation_key(9, 4, 8), sample.data(), out.data());
  EXPECT_EQ(std::vector<float>(a[1].inputs.begin() + 16, a[1].inputs.begin() + 32), out);
}

// Samples whose index is in `bad` throw BadSample; the rest read as `numbered`.
class FlakyDataset final : public Dataset {
 public:
  FlakyDataset(int64_t samples, std::set<int64_t> bad)
      : Dataset({1}, samples, 7), good_(numbered(samples, {1}, true)), bad_(std::move(bad)) {}
  int32_t read(int64_t index, float* input, float* target) const override {
    if (bad_.contains(index)) throw BadSample("images/" + std::to_string(index) + ".png: truncated");
    return good_.read(index, input, target);
  }

 private:
  InMemoryDataset good_;
  std::set<int64_t> bad_;
};

TEST(BatchLoader, BadSampleStopsTheRunNamingItByDefault) {
  const FlakyDataset ds(6, {4});
  for (const int workers : {0, 2}) {
    BatchLoader loader(ds, {.workers = workers});
    const std::vector<int64_t> batch = {1, 4};
    loader.start(0, {batch});
    test_util::expect_error([&] { loader.take(); }, {"images/4.png: truncated"});
  }
}

TEST(BatchLoader, SkipReplacesABadSampleByTheNextGoodOneAndCountsIt) {
  const FlakyDataset ds(6, {4, 5});
  for (const int workers : {0, 2}) {
    BatchLoader loader(ds, {.workers = workers, .skip_bad_samples = true});
    const std::vector<Read> got = read_all(loader, 0, {{1, 4}, {2}});
    EXPECT_EQ(got[0].inputs, (std::vector<float>{100, 0}));  // 4 and 5 are bad: wrapped round to 0
    EXPECT_EQ(got[0].labels, (std::vector<int32_t>{1, 0}));
    const BadSampleCount bad = loader.take_bad_samples();
    EXPECT_EQ(bad.samples, 2);
    EXPECT_EQ(bad.first, "images/4.png: truncated");
    EXPECT_EQ(loader.take_bad_samples().samples, 0);  // counted once
  }
  std::set<int64_t> all_bad;
  for (int64_t i = 0; i < 40; ++i) all_bad.insert(i);
  const FlakyDataset hopeless(40, all_bad);
  BatchLoader loader(hopeless, {.skip_bad_samples = true});
  const std::vector<int64_t> batch = {3};
  loader.start(0, {batch});
  test_util::expect_error([&] { loader.take(); }, {"16 bad samples in a row from index 3", "images/18.png"});
}

TEST(BatchLoader, DefaultWorkersFollowTheCostOfAReadAndTheCpusOfTheRank) {
  EXPECT_EQ(default_workers(ReadCost::kMemory, 8), 0);
  EXPECT_EQ(default_workers(ReadCost::kFile, 8), 1);
  // Decoding takes a worker per CPU of the rank's share, at least 1 and at most 4.
  EXPECT_EQ(default_workers(ReadCost::kDecode, 0), 1);
  EXPECT_EQ(default_workers(ReadCost::kDecode, 1), 1);
  EXPECT_EQ(default_workers(ReadCost::kDecode, 3), 3);
  EXPECT_EQ(default_workers(ReadCost::kDecode, 4), 4);
  EXPECT_EQ(default_workers(ReadCost::kDecode, 64), 4);
  // A rank that feeds a GPU gathers even batches in memory on a worker, off the thread that queues
  // the kernels; the other costs already have one at least.
  EXPECT_EQ(default_workers(ReadCost::kMemory, 1, /*feeds_gpu=*/true), 1);
  EXPECT_EQ(default_workers(ReadCost::kMemory, 8, /*feeds_gpu=*/true), 1);
  EXPECT_EQ(default_workers(ReadCost::kFile, 1, /*feeds_gpu=*/true), 1);
  EXPECT_EQ(default_workers(ReadCost::kDecode, 2, /*feeds_gpu=*/true), 2);
}

}  // namespace
}  // namespace dptrain::data
