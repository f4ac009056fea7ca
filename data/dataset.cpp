// MNIST-layout loader: reads the image and label IDX files, checks they agree, normalises pixels.
#include "data/dataset.h"

#include <algorithm>

#include "core/error.h"
#include "data/idx.h"

namespace dptrain::data {

Dataset load_image_dataset(const std::string& dir, bool train, float mean, float std_dev,
                           int64_t max_samples) {
  constexpr int kClasses = 10;
  DPTRAIN_CHECK(std_dev > 0.0f, dir, ": normalisation std must be positive, got ", std_dev);
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path = resolve_idx_path(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = resolve_idx_path(dir, prefix + "-labels-idx1-ubyte");
  const IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);

  DPTRAIN_CHECK(images.dims.size() == 3, images_path, ": expected 3 dims (count x rows x cols), found ",
                images.dims.size());
  DPTRAIN_CHECK(labels.dims.size() == 1, labels_path, ": expected 1 dim (count), found ", labels.dims.size());
  DPTRAIN_CHECK(images.dims[0] == labels.dims[0], images_path, " has ", images.dims[0], " images but ",
                labels_path, " has ", labels.dims[0], " labels");

  Dataset ds;
  // Every label is checked, but only the samples kept are converted: short runs on a subset (tests,
  // benchmarks) skip most of the float conversion.
  ds.size = max_samples > 0 ? std::min(max_samples, images.dims[0]) : images.dims[0];
  ds.sample_shape = {1, images.dims[1], images.dims[2]};
  ds.num_classes = kClasses;

  ds.labels.resize(static_cast<std::size_t>(ds.size));
  for (std::size_t i = 0; i < labels.bytes.size(); ++i) {
    const int label = labels.bytes[i];
    DPTRAIN_CHECK(label < kClasses, labels_path, ": label ", label, " at index ", i, " is outside [0, ",
                  kClasses, ")");
    if (i < ds.labels.size()) ds.labels[i] = label;
  }

  // A table in the same operation order as torchvision's ToTensor + Normalize, so inputs match
  // PyTorch-generated fixtures bit for bit.
  float table[256];
  for (int p = 0; p < 256; ++p) table[p] = (static_cast<float>(p) / 255.0f - mean) / std_dev;
  ds.inputs.resize(static_cast<std::size_t>(ds.size * images.dims[1] * images.dims[2]));
  for (std::size_t i = 0; i < ds.inputs.size(); ++i) ds.inputs[i] = table[images.bytes[i]];
  return ds;
}

void keep_first(Dataset& ds, int64_t n) {
  if (n <= 0 || n >= ds.size) return;
  const auto per_sample = [&](std::size_t total) { return total / static_cast<std::size_t>(ds.size); };
  ds.inputs.resize(per_sample(ds.inputs.size()) * n);
  if (!ds.labels.empty()) ds.labels.resize(n);
  if (!ds.targets.empty()) ds.targets.resize(per_sample(ds.targets.size()) * n);
  ds.size = n;
}

}  // namespace dptrain::data
