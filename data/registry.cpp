// The dataset registry: one line per format in kDatasets.
#include "data/registry.h"

#include "core/registry.h"
#include "data/synthetic.h"

namespace dptrain::data {

Dataset load_cifar(const DatasetRequest& request);  // data/cifar.cpp

namespace {

Dataset load_idx(const DatasetRequest& r) {
  return load_image_dataset(r.dir, r.train, r.mean, r.std, r.max_samples);
}

Dataset make_linear(const DatasetRequest& r) {
  return make_linear_dataset(r.train ? r.linear.samples : r.linear.test_samples, r.linear.coefficients,
                             r.linear.noise, r.seed + (r.train ? 0 : 1));
}

Dataset make_synthetic(const DatasetRequest& r) {
  DPTRAIN_CHECK(r.model_classes > 0,
                "data.dataset \"synthetic\" needs a model with [classes] outputs, this one does not");
  return make_random_images(r.train ? r.synthetic.samples : r.synthetic.test_samples, r.sample_shape,
                            static_cast<int>(r.model_classes), r.seed + (r.train ? 0 : 1));
}

constexpr DatasetEntry kMnist{"mnist", load_idx, "data/mnist", ""},
    kFashionMnist{"fashion_mnist", load_idx, "/usr/share/datasets/fashion-mnist", ""},
    kLinear{"linear", make_linear, "", "linear (synthetic)"},
    kSynthetic{"synthetic", make_synthetic, "", "random images (synthetic)"},
    kCifar{"cifar", load_cifar, "data/cifar", ""};
constexpr const DatasetEntry* kDatasets[] = {&kMnist, &kFashionMnist, &kLinear, &kSynthetic, &kCifar};

}  // namespace

const DatasetEntry& dataset_format(const std::string& name) {
  return find_registered<DatasetEntry>(kDatasets, name, "config key data.dataset");
}

std::vector<std::string> dataset_names() {
  return registered_names<DatasetEntry>(kDatasets);
}

}  // namespace dptrain::data
