// StepMetrics: per-batch loss and accuracy kept on the device until the host reads them in one go.
#include "trainer/step_metrics.h"

#include "core/backend.h"

namespace dptrain::trainer {

StepMetrics::StepMetrics(Device device, bool classification)
    : device_(device), classification_(classification), host_(2 * kCapacity) {
  if (!device_.is_host()) pending_ = make_storage(sizeof(float) * 2 * kCapacity, device_);
}

void StepMetrics::add(const Tensor& loss, const Tensor& logits, std::span<const int32_t> labels,
                      distributed::ExactScalarSum& loss_sum, int64_t& correct) {
  if (static_cast<int64_t>(samples_.size()) == kCapacity) flush(loss_sum, correct);
  const auto k = static_cast<int64_t>(samples_.size());
  samples_.push_back(logits.dim(0));
  Backend& backend = backend_for(device_);
  float* loss_slot = pending_ ? pending_->as<float>() + k : &host_[k];
  float* count_slot = pending_ ? pending_->as<float>() + kCapacity + k : &host_[kCapacity + k];
  // On the host the backend's copies and count are plain memory: the same ops, done at once.
  backend.copy(loss_slot, loss.data_ptr(), sizeof(float));
  if (classification_) backend.count_correct(logits.data_ptr(), labels, logits.dim(1), count_slot);
}

void StepMetrics::flush(distributed::ExactScalarSum& loss_sum, int64_t& correct) {
  if (samples_.empty()) return;
  const std::size_t k = samples_.size();
  if (pending_) {
    Backend& backend = backend_for(device_);
    backend.copy_to_host(host_.data(), pending_->as<float>(), sizeof(float) * k);
    if (classification_)
      backend.copy_to_host(host_.data() + kCapacity, pending_->as<float>() + kCapacity, sizeof(float) * k);
  }
  for (std::size_t i = 0; i < k; ++i) {
    loss_sum.add(static_cast<double>(host_[i]) * static_cast<double>(samples_[i]));
    if (classification_) correct += static_cast<int64_t>(host_[kCapacity + i]);
  }
  samples_.clear();
}

}  // namespace dptrain::trainer
