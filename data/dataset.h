// Dataset: the interface every data format implements (random access by sample index), and the
// in-memory dataset that generated data and tests use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace dptrain::data {

// A fault of one sample alone (a corrupt or truncated image, a label out of range). With
// data.on_bad_sample "skip" the loader replaces the sample and counts it; otherwise it stops the run
// like any other Error. The message names the file and the sample's index.
class BadSample : public Error {
 public:
  using Error::Error;
};

// What reading a sample costs: the loader's default number of workers follows it.
enum class ReadCost {
  kMemory,  // already decoded in memory: read inline
  kFile,    // bytes from a mapped file, converted to floats
  kDecode,  // an image file to decode (PNG, JPEG)
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  int64_t size() const { return size_; }
  const Shape& sample_shape() const { return sample_shape_; }
  int64_t sample_numel() const { return shape_numel(sample_shape_); }
  int num_classes() const { return num_classes_; }        // 0 for regression
  int64_t target_width() const { return target_width_; }  // regression targets per sample; 0 for classes
  // The classes' names where the data names them (image_folder's folders); empty elsewhere.
  const std::vector<std::string>& class_names() const { return class_names_; }

  // Sample `index` in [0, size()) as stored, before normalisation: byte pixels become p / 255.0f (the
  // operation of torchvision's ToTensor), float data is copied as it is. Writes sample_numel() floats
  // to `input` and target_width() floats to `target` (null when there are none); returns the label
  // (0 for regression). Safe to call from several threads at once. Throws BadSample for a fault of
  // this sample alone, Error for anything else.
  virtual int32_t read(int64_t index, float* input, float* target) const = 0;
  // Whether samples are pixels that data.mean and data.std normalise; false for generated features
  // and N(0, 1) images, which are used as they are.
  virtual bool is_image() const { return true; }
  virtual ReadCost read_cost() const { return ReadCost::kFile; }

  // Keeps the first n samples (all when n is 0 or not smaller than the size): short runs on a subset.
  void keep_first(int64_t n) {
    if (n > 0 && n < size_) size_ = n;
  }

 protected:
  Dataset(Shape sample_shape, int64_t size, int num_classes, int64_t target_width = 0,
          std::vector<std::string> class_names = {})
      : sample_shape_(std::move(sample_shape)),
        size_(size),
        num_classes_(num_classes),
        target_width_(target_width),
        class_names_(std::move(class_names)) {}

 private:
  Shape sample_shape_;
  int64_t size_;
  int num_classes_;
  int64_t target_width_;
  std::vector<std::string> class_names_;
};

// Samples held in memory as floats: generated data (linear regression, random images) and tests.
class InMemoryDataset final : public Dataset {
 public:
  // inputs: size x shape_numel(sample_shape), sample-major; labels: one per sample, or empty with
  // targets (size x target_width) for regression. is_image: whether data.mean / data.std apply.
  InMemoryDataset(Shape sample_shape, std::vector<float> inputs, std::vector<int32_t> labels, int num_classes,
                  std::vector<float> targets = {}, bool is_image = false);

  int32_t read(int64_t index, float* input, float* target) const override;
  bool is_image() const override { return is_image_; }
  ReadCost read_cost() const override { return ReadCost::kMemory; }

 private:
  std::vector<float> inputs_;
  std::vector<int32_t> labels_;
  std::vector<float> targets_;
  bool is_image_;
};

}  // namespace dptrain::data
