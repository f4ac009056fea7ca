// Tests for the "image_folder" dataset format, on folder trees of PNG and JPEG files written per test.
#include "data/image_folder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/image_codec.h"
#include "data/registry.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using dptrain::data::BadSample;
using dptrain::data::DatasetRequest;
using dptrain::data::Image;
using dptrain::data::open_image_folder;
using dptrain::data::ReadCost;

namespace {

using dptrain::test_util::error_of;

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Distinct pixels per seed.
Image pattern(int64_t height, int64_t width, int64_t channels, int seed) {
  Image image{height, width, channels,
              std::vector<uint8_t>(static_cast<std::size_t>(height * width * channels))};
  for (std::size_t i = 0; i < image.pixels.size(); ++i)
    image.pixels[i] = static_cast<uint8_t>(seed * 41 + i * 7);
  return image;
}

// The sample read() should produce from an image of the stored size: CHW, p / 255.0f.
std::vector<float> chw(const Image& image) {
  std::vector<float> out(image.pixels.size());
  const int64_t plane = image.height * image.width;
  for (int64_t c = 0; c < image.channels; ++c)
    for (int64_t i = 0; i < plane; ++i)
      out[static_cast<std::size_t>(c * plane + i)] =
          static_cast<float>(image.pixels[static_cast<std::size_t>(i * image.channels + c)]) / 255.0f;
  return out;
}

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = dptrain::test_util::make_temp_dir("image_folder_test");
    request_.dir = dir_.string();
    request_.sample_shape = {3, 4, 5};
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& relative) const { return (dir_ / relative).string(); }

  fs::path dir_;
  DatasetRequest request_{};
};

// Classes created b, a, c and files out of order: labels follow the sorted names, a = 0.
TEST_F(ImageFolderTest, ReadsClassesAndFilesInSortedOrder) {
  const Image b1 = pattern(4, 5, 3, 1), a2 = pattern(4, 5, 3, 2), a1 = pattern(4, 5, 3, 3),
              c1 = pattern(4, 5, 1, 4);
  const Image b0 = pattern(4, 5, 3, 5);
  write_file(path("train/b/z1.png"), encode_png(b1));
  write_file(path("train/b/Y0.JPG"), encode_jpeg(b0, 90));  // "Y0" < "z1" in byte order
  write_file(path("train/a/2.png"), encode_png(a2));
  write_file(path("train/a/1.png"), encode_png(a1));
  write_file(path("train/a/notes.txt"), {'h', 'i'});
  write_file(path("train/a/3.gif"), {'G', 'I', 'F'});
  write_file(path("train/c/only.jpeg"), encode_jpeg(c1, 95));
  fs::create_directories(path("train/c/nested.png"));  // a folder, whatever its name

  const auto dataset = open_image_folder(request_);
  ASSERT_EQ(dataset->size(), 5);
  EXPECT_EQ(dataset->num_classes(), 3);
  EXPECT_EQ(dataset->class_names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(dataset->sample_shape(), (dptrain::Shape{3, 4, 5}));
  EXPECT_EQ(dataset->read_cost(), ReadCost::kDecode);
  EXPECT_TRUE(dataset->is_image());

  // JPEGs are compared with what the decoder makes of the same file (grey replicated for c).
  const Image b0_decoded = dptrain::data::decode_image(encode_jpeg(b0, 90), "b0");
  const Image c1_decoded =
      dptrain::data::to_channels(dptrain::data::decode_image(encode_jpeg(c1, 95), "c1"), 3);
  const std::vector<std::pair<int32_t, Image>> want = {
      {0, a1}, {0, a2}, {1, b0_decoded}, {1, b1}, {2, c1_decoded}};
  std::vector<float> sample(60);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(dataset->read(i, sample.data(), nullptr), want[static_cast<std::size_t>(i)].first) << i;
    EXPECT_EQ(sample, chw(want[static_cast<std::size_t>(i)].second)) << "sample " << i;
  }
}

TEST_F(ImageFolderTest, ConvertsResizesAndCrops) {
  const Image rgb = pattern(8, 12, 3, 7);
  write_file(path("test/only/x.png"), encode_png(rgb));
  request_.train = false;
  request_.sample_shape = {1, 4, 4};
  request_.resize = 4;
  const auto dataset = open_image_folder(request_);
  std::vector<float> sample(16);
  EXPECT_EQ(dataset->read(0, sample.data(), nullptr), 0);
  using namespace dptrain::data;
  EXPECT_EQ(sample, chw(center_crop(resize_shorter_side(to_channels(rgb, 1), 4), 4, 4, "x")));

  // Without a resize the image is only cropped; one smaller than the crop is a bad sample.
  request_.resize = 0;
  EXPECT_EQ(open_image_folder(request_)->read(0, sample.data(), nullptr), 0);
  EXPECT_EQ(sample, chw(center_crop(to_channels(rgb, 1), 4, 4, "x")));
  request_.sample_shape = {1, 9, 4};
  const std::string msg = error_of([&] { open_image_folder(request_)->read(0, sample.data(), nullptr); });
  EXPECT_CONTAINS(msg, path("test/only/x.png") + ": image of 8x12 is smaller than the center crop 9x4");
}

// A cap takes the classes' files in turn (a, b, c, a, c, a, ...), then keeps the class-by-class order:
// with a: 3 files, b: 1, c: 2, a cap of 4 is a/1, a/2, b/1, c/1; of 5 adds c/2; of 10, all 6.
TEST_F(ImageFolderTest, ACapKeepsEveryClassesShare) {
  const std::vector<std::string> names = {"a/1.png", "a/2.png", "a/3.png", "b/1.png", "c/1.png", "c/2.png"};
  for (std::size_t i = 0; i < names.size(); ++i)
    write_file(path("train/") + names[i], encode_png(pattern(4, 5, 3, static_cast<int>(i))));
  const auto files_of = [&](int64_t cap) {
    request_.max_samples = cap;
    const auto dataset = open_image_folder(request_);
    EXPECT_EQ(dataset->num_classes(), 3) << "cap " << cap;
    std::vector<std::string> files;
    std::vector<float> sample(60);
    for (int64_t i = 0; i < dataset->size(); ++i) {
      const int32_t label = dataset->read(i, sample.data(), nullptr);
      for (std::size_t k = 0; k < names.size(); ++k)
        if (sample == chw(pattern(4, 5, 3, static_cast<int>(k)))) {
          files.push_back(names[k]);
          EXPECT_EQ(label, names[k][0] - 'a') << names[k];
        }
    }
    return files;
  };
  EXPECT_EQ(files_of(4), (std::vector<std::string>{"a/1.png", "a/2.png", "b/1.png", "c/1.png"}));
  EXPECT_EQ(files_of(5), (std::vector<std::string>{"a/1.png", "a/2.png", "b/1.png", "c/1.png", "c/2.png"}));
  EXPECT_EQ(files_of(2), (std::vector<std::string>{"a/1.png", "b/1.png"}));
  EXPECT_EQ(files_of(10), names);
  EXPECT_EQ(files_of(0), names);  // 0: no cap
}

TEST_F(ImageFolderTest, LayoutErrors) {
  std::string msg = error_of([&] { open_image_folder(request_); });
  EXPECT_CONTAINS(msg, path("train") + ": no such folder");
  EXPECT_CONTAINS(msg, "<data.dir>/train/<class>/<image>");

  fs::create_directories(path("train"));
  write_file(path("train/stray.png"), encode_png(pattern(4, 5, 3, 0)));
  EXPECT_CONTAINS(error_of([&] { open_image_folder(request_); }), path("train") + ": no class folders");

  write_file(path("train/a/1.png"), encode_png(pattern(4, 5, 3, 0)));
  write_file(path("train/b/readme.txt"), {'x'});
  EXPECT_CONTAINS(error_of([&] { open_image_folder(request_); }), path("train/b") + ": empty class");

  write_file(path("train/b/1.jpg"), encode_jpeg(pattern(4, 5, 3, 0), 90));
  fs::create_directories(path("train/c"));
  write_file(path("train/c/1.png"), encode_png(pattern(4, 5, 3, 0)));
  request_.model_classes = 2;
  EXPECT_CONTAINS(error_of([&] { open_image_folder(request_); }),
                  path("train") + ": 3 class folders, more than the model's 2 outputs");
  request_.model_classes = 3;
  EXPECT_EQ(open_image_folder(request_)->size(), 3);

  request_.sample_shape = {2, 4, 5};
  EXPECT_CONTAINS(error_of([&] { open_image_folder(request_); }), "C = 1 (grey) or 3 (RGB)");
  request_.sample_shape = {4, 5};
  EXPECT_CONTAINS(error_of([&] { open_image_folder(request_); }), "[C, H, W]");
}

TEST_F(ImageFolderTest, BadFilesAreBadSamplesOfTheirIndex) {
  const std::vector<uint8_t> good = encode_png(pattern(4, 5, 3, 0));
  write_file(path("train/a/0.png"), good);
  write_file(path("train/a/1.png"),
             {good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)});
  write_file(path("train/a/2.jpg"), {'n', 'o', 'p', 'e'});
  write_file(path("train/a/3.png"), good);
  const auto dataset = open_image_folder(request_);
  std::vector<float> sample(60);
  EXPECT_EQ(dataset->read(0, sample.data(), nullptr), 0);

  const auto bad_sample_of = [&](int64_t index) -> std::string {
    try {
      dataset->read(index, sample.data(), nullptr);
    } catch (const BadSample& e) {
      return e.what();
    }
    return "<no BadSample thrown>";
  };
  std::string msg = bad_sample_of(1);
  EXPECT_EQ(msg.rfind(path("train/a/1.png") + ": truncated PNG", 0), 0u) << msg;
  EXPECT_CONTAINS(msg, "(sample 1;");
  EXPECT_CONTAINS(bad_sample_of(2), path("train/a/2.jpg") + ": not a PNG or JPEG file");

  fs::remove(path("train/a/3.png"));  // vanished since the folder was listed
  msg = bad_sample_of(3);
  EXPECT_EQ(msg.rfind(path("train/a/3.png") + ": cannot open", 0), 0u) << msg;
  EXPECT_CONTAINS(msg, "(sample 3;");
}

TEST_F(ImageFolderTest, ReadsFromSeveralThreadsAtOnce) {
  std::vector<Image> images;
  for (int i = 0; i < 12; ++i) {
    images.push_back(pattern(4, 5, 3, i));
    write_file(path("train/k/" + std::to_string(10 + i) + ".png"), encode_png(images.back()));
  }
  const auto dataset = open_image_folder(request_);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> sample(60);
      for (int round = 0; round < 5; ++round)
        for (int64_t i = 0; i < 12; ++i) {
          dataset->read(i, sample.data(), nullptr);
          mismatches[static_cast<std::size_t>(t)] += sample != chw(images[static_cast<std::size_t>(i)]);
        }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, (std::vector<int>(4, 0)));
}

}  // namespace
