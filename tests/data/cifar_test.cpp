// Tests for the "cifar" dataset format on small CIFAR-10 and CIFAR-100 files written per test: labels,
// pixel order and pixel scaling by hand, the sample limit, and errors that name the file.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "data/registry.h"
#include "tests/data/read_samples.h"
#include "tests/test_util.h"

namespace dptrain::data {
namespace {

constexpr int kPixels = 3 * 32 * 32;

// A record whose pixel i holds (seed + i) % 256, after its label bytes.
std::vector<unsigned char> record(std::vector<unsigned char> labels, int seed) {
  std::vector<unsigned char> r = std::move(labels);
  for (int i = 0; i < kPixels; ++i) r.push_back(static_cast<unsigned char>((seed + i) % 256));
  return r;
}

void write(const std::filesystem::path& path, const std::vector<std::vector<unsigned char>>& records) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& r : records)
    out.write(reinterpret_cast<const char*>(r.data()), static_cast<std::streamsize>(r.size()));
}

std::unique_ptr<Dataset> load(const std::filesystem::path& dir, bool train, int64_t max_samples = 0) {
  return dataset_format("cifar").open({.train = train, .dir = dir.string(), .max_samples = max_samples});
}

TEST(Cifar, Cifar10TrainJoinsTheFiveBatchesInOrder) {
  const std::filesystem::path dir = test_util::make_temp_dir("cifar10");
  for (int b = 1; b <= 5; ++b)
    write(dir / ("data_batch_" + std::to_string(b) + ".bin"), {record({static_cast<unsigned char>(b)}, b)});
  write(dir / "test_batch.bin", {record({7}, 100), record({9}, 200)});
  const auto train = load(dir, true);
  ASSERT_EQ(train->size(), 5);
  EXPECT_EQ(train->sample_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(train->num_classes(), 10);
  const Samples samples = read_samples(*train);
  EXPECT_EQ(samples.labels, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  // Sample 2 (batch 3), channel 1 (green), row 0, column 5: pixel index 1024 + 5.
  EXPECT_EQ(samples.inputs[2 * kPixels + 1024 + 5], static_cast<float>((3 + 1024 + 5) % 256) / 255.0f);
  const auto test = load(dir, false, /*max_samples=*/1);
  ASSERT_EQ(test->size(), 1);
  EXPECT_EQ(read_samples(*test).labels, (std::vector<int32_t>{7}));
  std::filesystem::remove_all(dir);
}

TEST(Cifar, Cifar100TakesTheFineLabel) {
  const std::filesystem::path dir = test_util::make_temp_dir("cifar100");
  write(dir / "train.bin", {record({3, 99}, 0), record({19, 42}, 1)});
  write(dir / "test.bin", {record({0, 0}, 0)});
  const auto train = load(dir, true);
  EXPECT_EQ(train->num_classes(), 100);
  const Samples samples = read_samples(*train);
  EXPECT_EQ(samples.labels, (std::vector<int32_t>{99, 42}));
  EXPECT_EQ(samples.inputs[kPixels], 1.0f / 255.0f);  // sample 1's first pixel is 1
  std::filesystem::remove_all(dir);
}

TEST(Cifar, BadFilesAreErrorsNamingTheFile) {
  const std::filesystem::path dir = test_util::make_temp_dir("cifar_bad");
  test_util::expect_error([&] { load(dir, true); }, {dir.string(), "no CIFAR files"});
  write(dir / "test_batch.bin", {record({11}, 0)});
  test_util::expect_error([&] { load(dir, false); }, {"test_batch.bin", "label 11 of record 0", "[0, 10)"});
  std::vector<unsigned char> truncated = record({1}, 0);
  truncated.pop_back();
  write(dir / "test_batch.bin", {truncated});
  test_util::expect_error([&] { load(dir, false); },
                          {"test_batch.bin", "3072 bytes is not a whole number of 3073-byte records"});
  std::filesystem::remove_all(dir);
}

TEST(DatasetRegistry, UnknownNameListsTheRegisteredOnes) {
  test_util::expect_error([] { dataset_format("imagenet"); },
                          {"data.dataset = \"imagenet\"", "\"mnist\"", "\"fashion_mnist\"", "\"cifar\""});
}

}  // namespace
}  // namespace dptrain::data
