// Tests for the IDX reader and the MNIST-layout loader, on small fixtures written per test.
#include "data/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "data/registry.h"
#include "tests/data/read_samples.h"
#include "tests/test_util.h"

#ifndef DPTRAIN_SOURCE_DIR  // set by tests/data/CMakeLists.txt
#define DPTRAIN_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;
using dptrain::data::IdxArray;
using dptrain::data::read_samples;

std::unique_ptr<dptrain::data::Dataset> load_image_dataset(const std::string& dir, bool train,
                                                           int64_t max_samples = 0) {
  return dptrain::data::dataset_format("idx").open({.train = train, .dir = dir, .max_samples = max_samples});
}
using dptrain::data::read_idx;
using dptrain::data::resolve_idx_path;

namespace {

using dptrain::test_util::error_of;

// Header for an unsigned-byte IDX array with these dims (big-endian, as the format says).
std::vector<uint8_t> idx_header(const std::vector<uint32_t>& dims, uint8_t type = 0x08) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(d >> shift));
  return out;
}

std::vector<uint8_t> idx_file(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out = idx_header(dims);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> iota_bytes(std::size_t n, int start = 0) {
  std::vector<uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(start + i);
  return v;
}

void write_raw(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const fs::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.string().c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dptrain::test_util::make_temp_dir("idx_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(IdxTest, ReadsRawIdx3) {
  write_raw(path("a"), idx_file({2, 3, 4}, iota_bytes(24)));
  const IdxArray a = read_idx(path("a"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.bytes, iota_bytes(24));
}

TEST_F(IdxTest, ReadsGzipIdx1) {
  write_gz(path("labels.gz"), idx_file({5}, {9, 8, 7, 6, 5}));
  const IdxArray a = read_idx(path("labels.gz"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{5}));
  EXPECT_EQ(a.bytes, (std::vector<uint8_t>{9, 8, 7, 6, 5}));
}

TEST_F(IdxTest, ReadsLargeGzipAcrossChunks) {
  // Big enough to cross the reader's 16 MiB growth chunk.
  const std::vector<uint32_t> dims = {1100, 128, 128};
  write_gz(path("big.gz"), idx_file(dims, iota_bytes(1100 * 128 * 128, 3)));
  const IdxArray a = read_idx(path("big.gz"));
  EXPECT_EQ(a.bytes, iota_bytes(1100 * 128 * 128, 3));
}

TEST_F(IdxTest, TruncatedPayload) {
  write_raw(path("t"), idx_file({2, 3, 4}, iota_bytes(10)));
  const std::string msg = error_of([&] { read_idx(path("t")); });
  EXPECT_STARTS_WITH(msg, path("t") + ": truncated");
  EXPECT_CONTAINS(msg, "says 24 data bytes, file has 10");
}

TEST_F(IdxTest, TruncatedGzipPayload) {
  write_gz(path("t.gz"), idx_file({2, 3, 4}, iota_bytes(10)));
  const std::string msg = error_of([&] { read_idx(path("t.gz")); });
  EXPECT_STARTS_WITH(msg, path("t.gz") + ": truncated");
  EXPECT_CONTAINS(msg, "says 24 data bytes, file has 10");
}

TEST_F(IdxTest, TruncatedHeader) {
  write_raw(path("h"), {0, 0, 8, 3, 0, 0});
  const std::string msg = error_of([&] { read_idx(path("h")); });
  EXPECT_STARTS_WITH(msg, path("h") + ": truncated");
  EXPECT_CONTAINS(msg, "header needs 12 bytes of dimensions, file has 2");

  write_raw(path("e"), {});
  EXPECT_STARTS_WITH(error_of([&] { read_idx(path("e")); }), path("e") + ": truncated: 0 bytes");
}

TEST_F(IdxTest, CorruptGzip) {
  // A gzip stream cut short in the middle of its deflate data must not read as a clean file.
  write_gz(path("c.gz"), idx_file({1000}, iota_bytes(1000)));
  const auto size = fs::file_size(path("c.gz"));
  fs::resize_file(path("c.gz"), size / 2);
  EXPECT_STARTS_WITH(error_of([&] { read_idx(path("c.gz")); }), path("c.gz") + ": ");
}

TEST_F(IdxTest, TrailingBytes) {
  write_raw(path("x"), idx_file({2, 2}, iota_bytes(7)));
  const std::string msg = error_of([&] { read_idx(path("x")); });
  EXPECT_STARTS_WITH(msg, path("x") + ": 3 trailing bytes");
  EXPECT_CONTAINS(msg, "4 data bytes");
}

TEST_F(IdxTest, WrongMagic) {
  std::vector<uint8_t> bytes = idx_file({4}, iota_bytes(4));
  bytes[2] = 0x0D;  // float IDX: not ours
  write_raw(path("f"), bytes);
  std::string msg = error_of([&] { read_idx(path("f")); });
  EXPECT_STARTS_WITH(msg, path("f") + ": bad magic 0x00000d01");

  bytes[2] = 0x08;
  bytes[0] = 0x1f;
  write_raw(path("g"), bytes);
  msg = error_of([&] { read_idx(path("g")); });
  EXPECT_STARTS_WITH(msg, path("g") + ": bad magic 0x1f000801");
  EXPECT_CONTAINS(msg, "expected 0x000008NN");
}

TEST_F(IdxTest, WrongNumberOfDims) {
  write_raw(path("d0"), {0, 0, 8, 0});
  EXPECT_STARTS_WITH(error_of([&] { read_idx(path("d0")); }),
                     path("d0") + ": magic 0x00000800 declares 0 dims, supported are 1..4");
  write_raw(path("d5"), idx_file({1, 1, 1, 1, 1}, {7}));
  EXPECT_STARTS_WITH(error_of([&] { read_idx(path("d5")); }),
                     path("d5") + ": magic 0x00000805 declares 5 dims");
}

TEST_F(IdxTest, ZeroDimension) {
  write_raw(path("z"), idx_file({2, 0, 4}, {}));
  EXPECT_STARTS_WITH(error_of([&] { read_idx(path("z")); }), path("z") + ": dimension 1 is 0");
}

TEST_F(IdxTest, MissingFile) {
  const std::string msg = error_of([&] { read_idx(path("nope")); });
  EXPECT_STARTS_WITH(msg, path("nope") + ": cannot open");
  EXPECT_CONTAINS(msg, "scripts/setup.sh");
  EXPECT_STARTS_WITH(error_of([&] { read_idx(dir_.string()); }), dir_.string() + ": is a directory");
}

// A mapped file is checked by parse_idx, a gzipped one by read_idx: the same bytes get the same verdict
// and the same message (up to the source location) either way.
TEST_F(IdxTest, ParseIdxAgreesWithReadIdx) {
  const std::vector<std::vector<uint8_t>> files = {
      idx_file({2, 3}, iota_bytes(6)), idx_file({2, 3}, iota_bytes(5)),
      idx_file({2, 3}, iota_bytes(7)), {0, 0, 8, 3, 0, 0},
      {0, 0, 9, 1, 0, 0, 0, 1, 7},     {0, 0, 8, 0},
      {0, 0, 8, 1, 0, 0, 0, 0},        {0, 0}};
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string file = path("case" + std::to_string(i));
    write_raw(file, files[i]);
    const auto without_location = [](std::string message) { return message.substr(0, message.rfind(" (")); };
    const std::string read_error = error_of([&] { dptrain::data::read_idx(file); });
    const std::string parse_error = error_of([&] { dptrain::data::parse_idx(files[i], file); });
    EXPECT_EQ(without_location(read_error), without_location(parse_error)) << "case " << i;
  }
  const auto view = dptrain::data::parse_idx(files[0], "ok");
  EXPECT_EQ(view.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::vector<uint8_t>(view.bytes.begin(), view.bytes.end()), iota_bytes(6));
}

TEST_F(IdxTest, ResolvePrefersPlainThenGz) {
  write_gz(path("s.gz"), idx_file({1}, {1}));
  EXPECT_EQ(resolve_idx_path(dir_.string(), "s"), path("s.gz"));
  write_raw(path("s"), idx_file({1}, {1}));
  EXPECT_EQ(resolve_idx_path(dir_.string(), "s"), path("s"));
  const std::string msg = error_of([&] { resolve_idx_path(dir_.string(), "q"); });
  EXPECT_STARTS_WITH(msg, path("q") + ": not found");
  EXPECT_CONTAINS(msg, path("q.gz"));
}

// Four MNIST-layout files: n images of rows x cols, pixels i % 256, labels i % 10.
void write_mnist_like(const std::string& dir, const std::string& prefix, uint32_t n, bool gz) {
  const auto images = idx_file({n, 2, 3}, iota_bytes(n * 6));
  std::vector<uint8_t> labels(n);
  for (uint32_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  const fs::path d(dir);
  if (gz) {
    write_gz(d / (prefix + "-images-idx3-ubyte.gz"), images);
    write_gz(d / (prefix + "-labels-idx1-ubyte.gz"), idx_file({n}, labels));
  } else {
    write_raw(d / (prefix + "-images-idx3-ubyte"), images);
    write_raw(d / (prefix + "-labels-idx1-ubyte"), idx_file({n}, labels));
  }
}

TEST_F(IdxTest, LoadsImageDataset) {
  write_mnist_like(dir_.string(), "train", 12, /*gz=*/false);
  write_mnist_like(dir_.string(), "t10k", 4, /*gz=*/true);
  const auto train = load_image_dataset(dir_.string(), true);
  EXPECT_EQ(train->size(), 12);
  EXPECT_EQ(train->sample_shape(), (dptrain::Shape{1, 2, 3}));
  EXPECT_EQ(train->num_classes(), 10);
  EXPECT_EQ(train->target_width(), 0);
  const auto samples = read_samples(*train);
  ASSERT_EQ(samples.inputs.size(), 72u);
  ASSERT_EQ(samples.labels.size(), 12u);
  EXPECT_EQ(samples.labels[11], 1);
  for (std::size_t i = 0; i < 72; ++i) EXPECT_EQ(samples.inputs[i], static_cast<float>(i) / 255.0f) << i;

  const auto test = load_image_dataset(dir_.string(), false);  // gzipped: inflated at open
  EXPECT_EQ(test->size(), 4);
  EXPECT_EQ(read_samples(*test).inputs[23], 23.0f / 255.0f);
}

TEST_F(IdxTest, LoadsTheFirstSamplesOnlyWhenAskedAsKeepFirstWould) {
  write_mnist_like(dir_.string(), "train", 12, /*gz=*/false);
  auto all = load_image_dataset(dir_.string(), true);
  all->keep_first(5);
  const auto first = load_image_dataset(dir_.string(), true, 5);
  EXPECT_EQ(first->size(), 5);
  const auto kept = read_samples(*first);
  ASSERT_EQ(kept.inputs.size(), 30u);  // 5 samples of 2 x 3 pixels
  EXPECT_EQ(kept.inputs, read_samples(*all).inputs);
  EXPECT_EQ(kept.labels, read_samples(*all).labels);
  EXPECT_EQ(load_image_dataset(dir_.string(), true, 99)->size(), 12);  // more than there are: all
}

TEST_F(IdxTest, ImageDatasetErrorsNameFiles) {
  const std::string images = path("train-images-idx3-ubyte"), labels = path("train-labels-idx1-ubyte");
  write_raw(images, idx_file({3, 2, 2}, iota_bytes(12)));
  write_raw(labels, idx_file({2}, {1, 2}));
  std::string msg = error_of([&] { load_image_dataset(dir_.string(), true); });
  EXPECT_STARTS_WITH(msg, images + " has 3 images but " + labels + " has 2 labels");

  write_raw(labels, idx_file({3}, {1, 10, 2}));
  msg = error_of([&] { load_image_dataset(dir_.string(), true); });
  EXPECT_STARTS_WITH(msg, labels + ": label 10 at index 1 is outside [0, 10)");

  write_raw(images, idx_file({3, 4}, iota_bytes(12)));
  msg = error_of([&] { load_image_dataset(dir_.string(), true); });
  EXPECT_STARTS_WITH(msg, images + ": expected 3 dims");

  msg = error_of([&] { load_image_dataset(dir_.string(), false); });
  EXPECT_STARTS_WITH(msg, path("t10k-images-idx3-ubyte") + ": not found");
}

// The real files, when scripts/setup.sh has fetched them (skipped otherwise).
TEST(RealMnist, LoadsWhenPresent) {
  const char* env = std::getenv("DPTRAIN_DATA_DIR");
  const std::string dir = env && *env ? env : std::string(DPTRAIN_SOURCE_DIR) + "/data/mnist";
  if (!fs::exists(dir + "/t10k-labels-idx1-ubyte") && !fs::exists(dir + "/t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "no MNIST in " << dir << " (run scripts/setup.sh)";
  const auto test = load_image_dataset(dir, false);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->sample_shape(), (dptrain::Shape{1, 28, 28}));
  const auto samples = read_samples(*test);
  EXPECT_EQ(samples.labels[0], 7);  // the well-known first test digit
  std::vector<int> counts(10);
  for (int32_t l : samples.labels) ++counts[l];
  EXPECT_EQ(counts[0], 980);
  EXPECT_EQ(counts[1], 1135);
}

}  // namespace

// data.max_train_samples / max_test_samples: the first n samples, inputs, labels and targets alike.
TEST(KeepFirst, KeepsTheLeadingSamplesOnly) {
  dptrain::data::InMemoryDataset ds({2}, {0, 1, 10, 11, 20, 21, 30, 31}, {5, 6, 7, 8}, 10,
                                    {0.5f, 1.5f, 2.5f, 3.5f});
  ds.keep_first(0);  // 0: all
  EXPECT_EQ(ds.size(), 4);
  ds.keep_first(9);  // more than there are: all
  EXPECT_EQ(ds.size(), 4);
  ds.keep_first(3);
  EXPECT_EQ(ds.size(), 3);
  const auto samples = read_samples(ds);
  EXPECT_EQ(samples.inputs, (std::vector<float>{0, 1, 10, 11, 20, 21}));
  EXPECT_EQ(samples.labels, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(samples.targets, (std::vector<float>{0.5f, 1.5f, 2.5f}));
}
