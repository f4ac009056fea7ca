// The "cifar" dataset format: CIFAR-10 and CIFAR-100 in their binary record layout. A record is the
// label byte(s) then 3072 pixel bytes (32x32 red, then green, then blue). CIFAR-10:
// data_batch_{1..5}.bin and test_batch.bin, one label byte; CIFAR-100: train.bin and test.bin, a
// coarse and a fine label byte (the fine one, 100 classes, is the label).
#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "data/mapped_file.h"
#include "data/registry.h"

namespace dptrain::data {
namespace {

constexpr int64_t kPixels = 3 * 32 * 32;

struct CifarLayout {
  std::vector<std::string> files;
  int64_t label_bytes;
  int classes;
};

CifarLayout cifar_layout(const std::string& dir, bool train) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "test_batch.bin")) {
    CifarLayout ten{{}, 1, 10};
    if (train)
      for (int i = 1; i <= 5; ++i) ten.files.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
    else
      ten.files.push_back(dir + "/test_batch.bin");
    return ten;
  }
  DPTRAIN_CHECK(fs::exists(fs::path(dir) / "test.bin"), dir,
                ": no CIFAR files (CIFAR-10's data_batch_1..5.bin and test_batch.bin, or CIFAR-100's "
                "train.bin and test.bin); set data.dir to the folder that holds them");
  return {{dir + (train ? "/train.bin" : "/test.bin")}, 2, 100};
}

class CifarDataset final : public Dataset {
 public:
  CifarDataset(const CifarLayout& layout, std::vector<MappedFile> files, int64_t records)
      : Dataset({3, 32, 32}, records, layout.classes),
        label_bytes_(layout.label_bytes),
        files_(std::move(files)) {
    for (const MappedFile& file : files_)
      first_record_.push_back(first_record_.back() +
                              static_cast<int64_t>(file.bytes().size()) / record_bytes());
  }

  int32_t read(int64_t index, float* input, float*) const override {
    const std::size_t file = static_cast<std::size_t>(
        std::upper_bound(first_record_.begin(), first_record_.end(), index) - first_record_.begin() - 1);
    const uint8_t* record = files_[file].bytes().data() + (index - first_record_[file]) * record_bytes();
    const uint8_t* pixels = record + label_bytes_;
    for (int64_t i = 0; i < kPixels; ++i) input[i] = static_cast<float>(pixels[i]) / 255.0f;
    return record[label_bytes_ - 1];
  }

 private:
  int64_t record_bytes() const { return label_bytes_ + kPixels; }

  int64_t label_bytes_;
  std::vector<MappedFile> files_;
  std::vector<int64_t> first_record_{0};  // of each file, and the total at the end
};

}  // namespace

// Every label is checked here, so that reading a sample cannot fail.
std::unique_ptr<Dataset> open_cifar(const DatasetRequest& r) {
  const CifarLayout layout = cifar_layout(r.dir, r.train);
  const int64_t record = layout.label_bytes + kPixels;
  std::vector<MappedFile> files;
  int64_t records = 0;
  for (const std::string& path : layout.files) {
    MappedFile file(path);
    const std::span<const uint8_t> bytes = file.bytes();
    DPTRAIN_CHECK(!bytes.empty() && static_cast<int64_t>(bytes.size()) % record == 0, path, ": ",
                  bytes.size(), " bytes is not a whole number of ", record,
                  "-byte records (truncated, or not this CIFAR variant)");
    for (int64_t at = 0; at < static_cast<int64_t>(bytes.size()); at += record) {
      const int label = bytes[static_cast<std::size_t>(at + layout.label_bytes - 1)];
      DPTRAIN_CHECK(label < layout.classes, path, ": label ", label, " of record ", at / record,
                    " is outside [0, ", layout.classes, ")");
    }
    records += static_cast<int64_t>(bytes.size()) / record;
    files.push_back(std::move(file));
  }
  auto dataset = std::make_unique<CifarDataset>(layout, std::move(files), records);
  dataset->keep_first(r.max_samples);
  return dataset;
}

}  // namespace dptrain::data
