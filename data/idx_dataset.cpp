// The "idx" format of MNIST and Fashion-MNIST: the image file mapped (or, when gzipped, inflated once
// as bytes), converted to floats sample by sample as batches ask for them.
#include <optional>

#include "data/idx.h"
#include "data/mapped_file.h"
#include "data/registry.h"

namespace dptrain::data {
namespace {

constexpr int kIdxClasses = 10;

// The image file's pixels: a view into the mapping, or into the inflated bytes of a .gz.
struct IdxPixels {
  std::optional<MappedFile> mapped;
  std::vector<uint8_t> inflated;
  std::vector<int64_t> dims;
  std::span<const uint8_t> bytes;
};

IdxPixels open_idx_pixels(const std::string& path) {
  IdxPixels pixels;
  if (path.ends_with(".gz")) {
    IdxArray array = read_idx(path);
    pixels.dims = std::move(array.dims);
    pixels.inflated = std::move(array.bytes);
    pixels.bytes = pixels.inflated;
  } else {
    pixels.mapped.emplace(path);
    IdxView view = parse_idx(pixels.mapped->bytes(), path);
    pixels.dims = std::move(view.dims);
    pixels.bytes = view.bytes;
  }
  return pixels;
}

class IdxDataset final : public Dataset {
 public:
  IdxDataset(IdxPixels pixels, std::vector<int32_t> labels)
      : Dataset({1, pixels.dims[1], pixels.dims[2]}, pixels.dims[0], kIdxClasses),
        pixels_(std::move(pixels)),
        labels_(std::move(labels)) {}

  int32_t read(int64_t index, float* input, float*) const override {
    const int64_t numel = sample_numel();
    const uint8_t* p = pixels_.bytes.data() + index * numel;
    for (int64_t i = 0; i < numel; ++i) input[i] = static_cast<float>(p[i]) / 255.0f;
    return labels_[static_cast<std::size_t>(index)];
  }
  ReadCost read_cost() const override { return pixels_.mapped ? ReadCost::kFile : ReadCost::kMemory; }

 private:
  IdxPixels pixels_;
  std::vector<int32_t> labels_;
};

}  // namespace

std::unique_ptr<Dataset> open_idx(const DatasetRequest& r) {
  const std::string prefix = r.train ? "train" : "t10k";
  const std::string images_path = resolve_idx_path(r.dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = resolve_idx_path(r.dir, prefix + "-labels-idx1-ubyte");
  IdxPixels pixels = open_idx_pixels(images_path);
  const IdxArray labels = read_idx(labels_path);
  DPTRAIN_CHECK(pixels.dims.size() == 3, images_path, ": expected 3 dims (count x rows x cols), found ",
                pixels.dims.size());
  DPTRAIN_CHECK(labels.dims.size() == 1, labels_path, ": expected 1 dim (count), found ", labels.dims.size());
  DPTRAIN_CHECK(pixels.dims[0] == labels.dims[0], images_path, " has ", pixels.dims[0], " images but ",
                labels_path, " has ", labels.dims[0], " labels");
  std::vector<int32_t> label_values(labels.bytes.size());
  for (std::size_t i = 0; i < labels.bytes.size(); ++i) {
    const int label = labels.bytes[i];
    DPTRAIN_CHECK(label < kIdxClasses, labels_path, ": label ", label, " at index ", i, " is outside [0, ",
                  kIdxClasses, ")");
    label_values[i] = label;
  }
  auto dataset = std::make_unique<IdxDataset>(std::move(pixels), std::move(label_values));
  dataset->keep_first(r.max_samples);
  return dataset;
}

}  // namespace dptrain::data
