// The "cifar" dataset format: CIFAR-10 and CIFAR-100 in their binary record layout. A record is the
// label byte(s) then 3072 pixel bytes (32x32 red, then green, then blue). CIFAR-10:
// data_batch_{1..5}.bin and test_batch.bin, one label byte; CIFAR-100: train.bin and test.bin, a
// coarse and a fine label byte (the fine one, 100 classes, is the label).
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
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

std::vector<unsigned char> read_records(const std::string& path, int64_t record_bytes) {
  std::ifstream in(path, std::ios::binary);
  DPTRAIN_CHECK(in, path, ": cannot open CIFAR file");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DPTRAIN_CHECK(!bytes.empty() && static_cast<int64_t>(bytes.size()) % record_bytes == 0, path, ": ",
                bytes.size(), " bytes is not a whole number of ", record_bytes,
                "-byte records (truncated, or not this CIFAR variant)");
  return bytes;
}

}  // namespace

Dataset load_cifar(const DatasetRequest& r) {
  DPTRAIN_CHECK(r.std > 0.0f, r.dir, ": normalisation std must be positive, got ", r.std);
  const CifarLayout layout = cifar_layout(r.dir, r.train);
  const int64_t record = layout.label_bytes + kPixels;
  float table[256];  // the operation order of torchvision's ToTensor + Normalize
  for (int p = 0; p < 256; ++p) table[p] = (static_cast<float>(p) / 255.0f - r.mean) / r.std;
  Dataset ds;
  ds.sample_shape = {3, 32, 32};
  ds.num_classes = layout.classes;
  for (const std::string& path : layout.files) {
    const std::vector<unsigned char> bytes = read_records(path, record);
    for (int64_t at = 0; at < static_cast<int64_t>(bytes.size()); at += record) {
      if (r.max_samples > 0 && ds.size == r.max_samples) return ds;
      const int label = bytes[static_cast<std::size_t>(at + layout.label_bytes - 1)];
      DPTRAIN_CHECK(label < layout.classes, path, ": label ", label, " of record ", at / record,
                    " is outside [0, ", layout.classes, ")");
      ds.labels.push_back(label);
      const unsigned char* pixels = bytes.data() + at + layout.label_bytes;
      std::transform(pixels, pixels + kPixels, std::back_inserter(ds.inputs),
                     [&](unsigned char p) { return table[p]; });
      ++ds.size;
    }
  }
  return ds;
}

}  // namespace dptrain::data
