// export_dataset: writes a data set the trainer can read (IDX, npy, CIFAR, image folders, or
// generated colour images) as an image folder of PNG or JPEG files, as .npy files or as CIFAR-10
// records, so that every format can be tried on data that is at hand.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_replacement.h"
#include "core/rng.h"
#include "data/image_codec.h"
#include "data/npy.h"
#include "data/registry.h"

namespace fs = std::filesystem;
using namespace dptrain;

namespace {

struct Options {
  std::string from = "mnist", dir, to, format = "png";
  int quality = 90;
  int64_t max_samples = 0;
  std::vector<int64_t> shape;  // image_folder sources: [C, H, W]; generated: [3, S, S]
  int64_t classes = 10, train_samples = 50000, test_samples = 10000;
  uint64_t seed = 0;
};

// A split's samples as bytes: what every format stores.
class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  virtual const Shape& shape() const = 0;  // [C, H, W]
  virtual int32_t read(int64_t index, uint8_t* pixels) = 0;
  virtual std::vector<std::string> class_names() const { return {}; }
};

// A registered format's split: its floats in [0, 1] back to the bytes they came from (p / 255.0f
// rounds back to p exactly for every byte).
class DatasetSource final : public Source {
 public:
  DatasetSource(std::unique_ptr<data::Dataset> dataset) : dataset_(std::move(dataset)) {
    shape_ = dataset_->sample_shape();
    if (shape_.size() == 2) shape_.insert(shape_.begin(), 1);
    DPTRAIN_CHECK(shape_.size() == 3, "export_dataset: samples of shape ",
                  shape_str(dataset_->sample_shape()), " are not images");
    floats_.resize(static_cast<std::size_t>(shape_numel(shape_)));
  }
  int64_t size() const override { return dataset_->size(); }
  const Shape& shape() const override { return shape_; }
  int32_t read(int64_t index, uint8_t* pixels) override {
    const int32_t label = dataset_->read(index, floats_.data(), nullptr);
    for (std::size_t i = 0; i < floats_.size(); ++i)
      pixels[i] = static_cast<uint8_t>(std::lround(std::clamp(floats_[i], 0.0f, 1.0f) * 255.0f));
    return label;
  }
  std::vector<std::string> class_names() const override { return dataset_->class_names(); }

 private:
  std::unique_ptr<data::Dataset> dataset_;
  Shape shape_;
  std::vector<float> floats_;
};

// Colour images a network can learn: each class has its own colour and stripe direction (a template
// made once), under per-pixel noise; sample i follows from (seed, i) alone. Cheap per pixel, so that
// data sets of many gigabytes export at disk speed.
class GeneratedSource final : public Source {
 public:
  GeneratedSource(int64_t samples, Shape shape, int64_t classes, uint64_t seed)
      : samples_(samples), shape_(std::move(shape)), classes_(classes), seed_(seed) {
    DPTRAIN_CHECK(shape_.size() == 3 && classes_ > 0,
                  "export_dataset: generated images need --shape C H W and --classes > 0");
    const int64_t channels = shape_[0], height = shape_[1], width = shape_[2];
    for (int64_t label = 0; label < classes_; ++label) {
      const double angle = std::numbers::pi * static_cast<double>(label) / static_cast<double>(classes_);
      for (int64_t c = 0; c < channels; ++c) {
        const double colour =
            0.5 + 0.4 * std::cos(2.0 * std::numbers::pi *
                                 (static_cast<double>(label) / static_cast<double>(classes_) +
                                  static_cast<double>(c) / 3.0));
        for (int64_t y = 0; y < height; ++y)
          for (int64_t x = 0; x < width; ++x) {
            const double stripe = 0.5 + 0.5 * std::sin(0.8 * (static_cast<double>(x) * std::cos(angle) +
                                                              static_cast<double>(y) * std::sin(angle)));
            templates_.push_back(static_cast<uint8_t>((0.45 * colour + 0.3 * stripe) * 255.0));
          }
      }
    }
  }
  int64_t size() const override { return samples_; }
  const Shape& shape() const override { return shape_; }
  int32_t read(int64_t index, uint8_t* pixels) override {
    Rng rng(derive_seed(seed_, "export/sample") + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull);
    const int32_t label = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes_)));
    const int64_t numel = shape_numel(shape_);
    const uint8_t* base = templates_.data() + label * numel;
    uint64_t noise = 0;
    for (int64_t i = 0; i < numel; ++i) {
      if (i % 8 == 0) noise = rng.next_u64();
      pixels[i] = static_cast<uint8_t>(base[i] + (noise & 63));  // at most 0.75 x 255 + 63 = 254
      noise >>= 8;
    }
    return label;
  }

 private:
  int64_t samples_;
  Shape shape_;
  int64_t classes_;
  uint64_t seed_;
  std::vector<uint8_t> templates_;  // classes x C x H x W
};

std::unique_ptr<Source> open_source(const Options& o, bool train) {
  if (o.from == "synthetic_color") {
    const Shape shape = o.shape.empty() ? Shape{3, 32, 32} : Shape(o.shape.begin(), o.shape.end());
    int64_t samples = train ? o.train_samples : o.test_samples;
    if (o.max_samples > 0) samples = std::min(samples, o.max_samples);
    return std::make_unique<GeneratedSource>(samples, shape, o.classes, o.seed + (train ? 0 : 1));
  }
  const data::DatasetEntry& format = data::dataset_format(o.from);
  auto dataset = format.open({.train = train,
                              .dir = o.dir.empty() ? format.default_dir : o.dir,
                              .max_samples = o.max_samples,
                              .sample_shape = Shape(o.shape.begin(), o.shape.end()),
                              .model_classes = o.classes});
  dataset->keep_first(o.max_samples);
  return std::make_unique<DatasetSource>(std::move(dataset));
}

class Progress {
 public:
  Progress(std::string what, int64_t total) : what_(std::move(what)), total_(total) {}
  void at(int64_t done) {
    const int64_t tenth = total_ >= 10 ? done * 10 / total_ : 10;
    if (tenth == shown_ && done != total_) return;
    shown_ = tenth;
    std::printf("\r%s: %lld/%lld", what_.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_));
    if (done == total_) std::printf("\n");
    std::fflush(stdout);
  }

 private:
  std::string what_;
  int64_t total_, shown_ = -1;
};

// Folder names that sort as the labels do: the data set's own names, else zero-padded numbers.
std::vector<std::string> folder_names(const Source& source, int64_t classes) {
  std::vector<std::string> names = source.class_names();
  if (!names.empty()) return names;
  const int digits = static_cast<int>(std::to_string(std::max<int64_t>(classes - 1, 0)).size());
  for (int64_t c = 0; c < classes; ++c) {
    std::string name = std::to_string(c);
    names.push_back(std::string(static_cast<std::size_t>(digits) - name.size(), '0') + name);
  }
  return names;
}

void write_file(const fs::path& path, std::span<const uint8_t> bytes) {
  FileReplacement file(path.string());
  file.out().write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  file.commit();
}

void export_images(Source& source, const Options& o, const fs::path& split) {
  const Shape& shape = source.shape();
  const std::vector<std::string> names = folder_names(source, o.classes);
  for (const std::string& name : names) fs::create_directories(split / name);
  std::vector<uint8_t> planar(static_cast<std::size_t>(shape_numel(shape)));
  data::Image image{.height = shape[1], .width = shape[2], .channels = shape[0], .pixels = planar};
  const int64_t plane = shape[1] * shape[2];
  const int digits = static_cast<int>(std::to_string(source.size()).size());
  Progress progress(split.string(), source.size());
  for (int64_t i = 0; i < source.size(); ++i) {
    const int32_t label = source.read(i, planar.data());
    DPTRAIN_CHECK(label >= 0 && label < static_cast<int32_t>(names.size()), "export_dataset: label ", label,
                  " of sample ", i, " is outside the ", names.size(), " classes (--classes)");
    for (int64_t c = 0; c < shape[0]; ++c)  // CHW to the interleaved HWC of image files
      for (int64_t p = 0; p < plane; ++p) image.pixels[p * shape[0] + c] = planar[c * plane + p];
    const std::vector<uint8_t> bytes =
        o.format == "png" ? data::encode_png(image) : data::encode_jpeg(image, o.quality);
    std::string number = std::to_string(i);
    number.insert(0, static_cast<std::size_t>(digits) - number.size(), '0');
    write_file(
        split / names[static_cast<std::size_t>(label)] / (number + (o.format == "png" ? ".png" : ".jpg")),
        bytes);
    progress.at(i + 1);
  }
}

// Streams the samples into the array file after its header: a data set larger than memory exports.
void export_npy(Source& source, const fs::path& out, const std::string& split) {
  const Shape& shape = source.shape();
  const int64_t n = source.size(), numel = shape_numel(shape);
  std::vector<int64_t> x_shape = {n};
  if (shape[0] == 1)
    x_shape.insert(x_shape.end(), shape.begin() + 1, shape.end());  // [N, H, W], as MNIST's arrays are
  else
    x_shape.insert(x_shape.end(), shape.begin(), shape.end());
  const fs::path x_path = out / (split + "_x.npy");
  // The source may be the array being replaced (an npy export into its own folder): it keeps
  // reading the old file until the rename.
  FileReplacement x_file(x_path.string());
  std::ofstream& x = x_file.out();
  const std::string header = data::npy_header("|u1", x_shape);
  x.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<uint8_t> pixels(static_cast<std::size_t>(numel));
  std::vector<int64_t> labels(static_cast<std::size_t>(n));
  Progress progress(x_path.string(), n);
  for (int64_t i = 0; i < n; ++i) {
    labels[static_cast<std::size_t>(i)] = source.read(i, pixels.data());
    x.write(reinterpret_cast<const char*>(pixels.data()), static_cast<std::streamsize>(numel));
    if ((i & 1023) == 1023 || i + 1 == n) progress.at(i + 1);
  }
  x_file.commit();
  data::write_npy((out / (split + "_y.npy")).string(), "<i8", {n},
                  {reinterpret_cast<const uint8_t*>(labels.data()), labels.size() * sizeof(int64_t)});
}

// CIFAR-10's files: the training split over data_batch_1..5.bin, the test split in test_batch.bin.
void export_cifar(Source& source, const fs::path& out, bool train) {
  DPTRAIN_CHECK(source.shape() == (Shape{3, 32, 32}),
                "export_dataset --format cifar needs 3 x 32 x 32 images, these are ",
                shape_str(source.shape()), " (--from synthetic_color makes them)");
  const int files = train ? 5 : 1;
  const int64_t n = source.size();
  std::vector<uint8_t> record(1 + 3072);
  for (int f = 0; f < files; ++f) {
    const fs::path path = out / (train ? "data_batch_" + std::to_string(f + 1) + ".bin" : "test_batch.bin");
    FileReplacement replacement(path.string());
    std::ofstream& file = replacement.out();
    for (int64_t i = n * f / files; i < n * (f + 1) / files; ++i) {
      const int32_t label = source.read(i, record.data() + 1);
      DPTRAIN_CHECK(label >= 0 && label < 10, "export_dataset: label ", label, " of sample ", i,
                    " does not fit CIFAR-10's one label byte for 10 classes");
      record[0] = static_cast<uint8_t>(label);
      file.write(reinterpret_cast<const char*>(record.data()), static_cast<std::streamsize>(record.size()));
    }
    replacement.commit();
    std::printf("%s: %lld records\n", path.c_str(),
                static_cast<long long>(n * (f + 1) / files - n * f / files));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"export_dataset: writes a data set in a format the trainer reads (docs/data.md)"};
  Options o;
  app.add_option("--from", o.from,
                 "A registered format (mnist, fashion_mnist, idx, npy, cifar, image_folder), or "
                 "synthetic_color for generated colour images")
      ->capture_default_str();
  app.add_option("--dir", o.dir, "The source's data.dir (default: the format's own folder)");
  app.add_option("--to", o.to, "Output folder")->required();
  app.add_option("--format", o.format, "png, jpeg (an image folder), npy or cifar")
      ->check(CLI::IsMember({"png", "jpeg", "npy", "cifar"}))
      ->capture_default_str();
  app.add_option("--quality", o.quality, "JPEG quality")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--max-samples", o.max_samples,
                 "Only the first N of each split (an image folder's: its classes' files in turn); 0: all")
      ->capture_default_str();
  app.add_option("--shape", o.shape, "C H W: an image_folder source's sample shape, or generated images'")
      ->expected(3);
  app.add_option("--classes", o.classes, "Classes (npy and image_folder sources; generated images)")
      ->capture_default_str();
  app.add_option("--train-samples", o.train_samples, "Generated images in the training split")
      ->capture_default_str();
  app.add_option("--test-samples", o.test_samples, "Generated images in the test split")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Generated images' seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const fs::path out(o.to);
    fs::create_directories(out);
    for (const bool train : {true, false}) {
      const std::unique_ptr<Source> source = open_source(o, train);
      const std::string split = train ? "train" : "test";
      if (o.format == "npy")
        export_npy(*source, out, split);
      else if (o.format == "cifar")
        export_cifar(*source, out, train);
      else
        export_images(*source, o, out / split);
    }
    std::printf("export_dataset: %s written (data.dataset \"%s\", data.dir \"%s\")\n", o.to.c_str(),
                o.format == "npy"     ? "npy"
                : o.format == "cifar" ? "cifar"
                                      : "image_folder",
                o.to.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export_dataset: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
