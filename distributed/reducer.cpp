// Bucketed, overlapped gradient averaging.
#include "distributed/reducer.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace dptrain::distributed {

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::kNone;
  if (name == "fp16") return Compression::kFp16;
  if (name == "bf16") return Compression::kBf16;
  DPTRAIN_FAIL("unknown compression \"", name, "\"; use \"none\", \"fp16\" or \"bf16\"");
}

std::string to_string(Compression compression) {
  switch (compression) {
    case Compression::kNone: return "none";
    case Compression::kFp16: return "fp16";
    case Compression::kBf16: return "bf16";
  }
  return "?";
}

GradientReducer::GradientReducer(Communicator& comm, std::vector<NamedTensor> parameters, ReducerOptions options)
    : comm_(comm), parameters_(std::move(parameters)), options_(options) {
  DPTRAIN_CHECK(options_.fusion_threshold_mb >= 0 && options_.first_bucket_mb >= 0,
                "distributed.fusion_threshold_mb must be >= 0");
  const auto limit = [](double mb) { return static_cast<int64_t>(mb * (1 << 20) / sizeof(float)); };
  bucket_of_.resize(parameters_.size());
  int64_t offset = 0;
  for (std::size_t k = parameters_.size(); k-- > 0;) {
    const int64_t n = parameters_[k].tensor.numel();
    // The first bucket stays small so communication starts early in backward; 0 means per tensor.
    const int64_t cap = options_.fusion_threshold_mb == 0 ? 0
                        : buckets_.size() <= 1       ? limit(std::min(options_.first_bucket_mb, options_.fusion_threshold_mb))
                                                     : limit(options_.fusion_threshold_mb);
    const bool fits = !buckets_.empty() && buckets_.back().numel + n <= cap &&
                      (buckets_.size() > 1 || options_.fusion_threshold_mb > 0);
    if (!fits) buckets_.push_back({{}, offset, 0});
    buckets_.back().parameters.push_back(k);
    buckets_.back().numel += n;
    bucket_of_[k] = buckets_.size() - 1;
    offset += n;
  }
  // Parameters were laid out in reverse order: bucket 0 holds the last layer.
  if (options_.compression == Compression::kNone) {
    flat_.resize(offset);
  } else {
    flat_half_.resize(offset);
  }
  pending_.resize(buckets_.size());
  ready_count_.assign(buckets_.size(), 0);
  if (comm_.size() > 1 && options_.overlap) {
    for (std::size_t k = 0; k < parameters_.size(); ++k)
      parameters_[k].tensor.impl()->on_grad_ready = [this, k] { on_gradient_ready(k); };
  }
}

GradientReducer::~GradientReducer() {
  for (NamedTensor& p : parameters_) p.tensor.impl()->on_grad_ready = nullptr;
}

std::string GradientReducer::label(std::size_t bucket) const {
  return "allreduce of gradient bucket " + std::to_string(bucket) + " (" + std::to_string(buckets_[bucket].numel) +
         " elements, first parameter " + parameters_[buckets_[bucket].parameters.front()].name + ") at step " +
         std::to_string(step_);
}

void GradientReducer::prepare(int64_t step) {
  step_ = step;
  armed_ = true;
  next_launch_ = 0;
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
}

void GradientReducer::on_gradient_ready(std::size_t parameter) {
  if (!armed_) return;  // an accumulation pass (backward_passes_per_step > 1)
  const std::size_t b = bucket_of_[parameter];
  ++ready_count_[b];
  launch_ready_in_order();
}

void GradientReducer::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && ready_count_[next_launch_] == buckets_[next_launch_].parameters.size())
    launch(next_launch_++);
}

void GradientReducer::launch(std::size_t b) {
  const Bucket& bucket = buckets_[b];
  int64_t at = bucket.offset;
  const float scale = 1.0f / static_cast<float>(comm_.size());
  for (std::size_t k : bucket.parameters) {
    const Tensor& t = parameters_[k].tensor;
    if (options_.compression == Compression::kNone) {
      std::memcpy(flat_.data() + at, t.grad_data(), sizeof(float) * t.numel());
    } else {
      // Scale by 1/N before the sum (not after) so the half-precision sum cannot overflow.
      floats_to_halves(t.grad_data(), flat_half_.data() + at, t.numel(), scale,
                       options_.compression == Compression::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16);
    }
    at += t.numel();
  }
  if (options_.compression == Compression::kNone) {
    pending_[b] = comm_.start_allreduce(std::span<float>(flat_.data() + bucket.offset, bucket.numel), ReduceOp::kSum,
                                        label(b));
  } else {
    pending_[b] = comm_.start_allreduce_half(
        std::span<uint16_t>(flat_half_.data() + bucket.offset, bucket.numel),
        options_.compression == Compression::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16, label(b));
  }
}

void GradientReducer::finish() {
  armed_ = false;
  if (comm_.size() == 1) return;
  // Whatever backward did not launch (overlap off, or parameters that got no gradient), in order.
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  const float inv = 1.0f / static_cast<float>(comm_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    comm_.wait(pending_[b]);
    int64_t at = buckets_[b].offset;
    for (std::size_t k : buckets_[b].parameters) {
      const Tensor& t = parameters_[k].tensor;
      float* g = t.grad_data();
      const int64_t n = t.numel();
      if (options_.compression == Compression::kNone) {
        const float* sum = flat_.data() + at;
        for (int64_t i = 0; i < n; ++i) g[i] = sum[i] * inv;
      } else {
        halves_to_floats(flat_half_.data() + at, g, n,
                         options_.compression == Compression::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16);
      }
      bool finite = true;
      for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(g[i]);
      DPTRAIN_CHECK(finite, "non-finite averaged gradient in ", parameters_[k].name, " (bucket ", b, ") at step ", step_,
                    "; not applied. Lower optimizer.lr", options_.compression != Compression::kNone
                        ? " or try distributed.compression \"none\" (fp16 overflows past 65504)" : "");
      at += n;
    }
  }
}

}  // namespace dptrain::distributed
