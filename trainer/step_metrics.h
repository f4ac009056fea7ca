// Each batch's loss and correct predictions, summed on the host in batch order, without the host
// waiting for a GPU every step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/storage.h"
#include "core/tensor.h"
#include "distributed/exact_sum.h"

namespace dptrain::trainer {

// On a GPU each batch's mean loss and count of correct predictions stay in a device buffer until
// flush() reads them all at once, where the host synchronizes anyway (a log line, the end of an epoch
// or an evaluation, a full buffer); on the host they are read at once. Either way flush() adds them
// batch by batch in the order they came, so the sums have the same bits as reading every step.
class StepMetrics {
 public:
  StepMetrics(Device device, bool classification);
  // A batch: `loss` its mean loss (a scalar), `logits` [labels.size(), classes] for classification.
  // With the buffer full, the batches before it are flushed into `loss_sum` and `correct` first.
  void add(const Tensor& loss, const Tensor& logits, std::span<const int32_t> labels,
           distributed::ExactScalarSum& loss_sum, int64_t& correct);
  // Adds the batches since the last flush to `loss_sum` (mean loss x samples) and `correct`.
  void flush(distributed::ExactScalarSum& loss_sum, int64_t& correct);

 private:
  static constexpr int64_t kCapacity = 256;  // batches between forced reads: 2 KB of device memory
  Device device_;
  bool classification_;
  StoragePtr pending_;            // on a GPU: kCapacity losses, then kCapacity counts
  std::vector<float> host_;       // the same, read back (or, on the host, written directly)
  std::vector<int64_t> samples_;  // per pending batch
};

}  // namespace dptrain::trainer
