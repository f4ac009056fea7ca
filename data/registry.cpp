// The dataset registry: one line per format in kDatasets.
#include "data/registry.h"

#include "core/registry.h"
#include "data/synthetic.h"

namespace dptrain::data {

// Each format's file.
std::unique_ptr<Dataset> open_idx(const DatasetRequest& request);           // data/idx_dataset.cpp
std::unique_ptr<Dataset> open_cifar(const DatasetRequest& request);         // data/cifar.cpp
std::unique_ptr<Dataset> open_npy(const DatasetRequest& request);           // data/npy.cpp
std::unique_ptr<Dataset> open_image_folder(const DatasetRequest& request);  // data/image_folder.cpp

namespace {

std::unique_ptr<Dataset> make_linear(const DatasetRequest& r) {
  return make_linear_dataset(r.train ? r.linear.samples : r.linear.test_samples, r.linear.coefficients,
                             r.linear.noise, r.seed + (r.train ? 0 : 1));
}

std::unique_ptr<Dataset> make_synthetic(const DatasetRequest& r) {
  DPTRAIN_CHECK(r.model_classes > 0,
                "data.dataset \"synthetic\" needs a model with [classes] outputs, this one does not");
  return make_random_images(r.train ? r.synthetic.samples : r.synthetic.test_samples, r.sample_shape,
                            static_cast<int>(r.model_classes), r.seed + (r.train ? 0 : 1));
}

constexpr DatasetEntry kMnist{"mnist", open_idx, "data/mnist", ""},
    kFashionMnist{"fashion_mnist", open_idx, "/usr/share/datasets/fashion-mnist", ""},
    kIdx{"idx", open_idx, "data/mnist", ""}, kNpy{"npy", open_npy, "data/npy", ""},
    kImageFolder{"image_folder", open_image_folder, "data/images", ""},
    kCifar{"cifar", open_cifar, "data/cifar", ""}, kLinear{"linear", make_linear, "", "linear (synthetic)"},
    kSynthetic{"synthetic", make_synthetic, "", "random images (synthetic)"};
constexpr const DatasetEntry* kDatasets[] = {&kMnist,       &kFashionMnist, &kIdx,    &kNpy,
                                             &kImageFolder, &kCifar,        &kLinear, &kSynthetic};

}  // namespace

const DatasetEntry& dataset_format(const std::string& name) {
  return find_registered<DatasetEntry>(kDatasets, name, "config key data.dataset");
}

std::vector<std::string> dataset_names() {
  return registered_names<DatasetEntry>(kDatasets);
}

}  // namespace dptrain::data
