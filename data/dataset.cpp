// InMemoryDataset: samples that are floats in memory already.
#include "data/dataset.h"

#include <cstring>

namespace dptrain::data {

namespace {
int64_t per_sample(std::size_t values, int64_t width) {
  return width > 0 ? static_cast<int64_t>(values) / width : 0;
}
}  // namespace

InMemoryDataset::InMemoryDataset(Shape sample_shape, std::vector<float> inputs, std::vector<int32_t> labels,
                                 int num_classes, std::vector<float> targets, bool is_image)
    : Dataset(sample_shape, per_sample(inputs.size(), shape_numel(sample_shape)), num_classes,
              per_sample(targets.size(), per_sample(inputs.size(), shape_numel(sample_shape)))),
      inputs_(std::move(inputs)),
      labels_(std::move(labels)),
      targets_(std::move(targets)),
      is_image_(is_image) {
  DPTRAIN_CHECK(labels_.empty() || static_cast<int64_t>(labels_.size()) == size(),
                "in-memory dataset: ", labels_.size(), " labels for ", size(), " samples");
}

int32_t InMemoryDataset::read(int64_t index, float* input, float* target) const {
  DPTRAIN_CHECK(index >= 0 && index < size(), "in-memory dataset: index ", index, " outside [0, ", size(),
                ")");
  const int64_t numel = sample_numel(), width = target_width();
  std::memcpy(input, inputs_.data() + index * numel, static_cast<std::size_t>(numel) * sizeof(float));
  if (width > 0)
    std::memcpy(target, targets_.data() + index * width, static_cast<std::size_t>(width) * sizeof(float));
  return labels_.empty() ? 0 : labels_[static_cast<std::size_t>(index)];
}

}  // namespace dptrain::data
