// Bucketed, overlapped gradient averaging.
#include "distributed/reducer.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/timeline.h"

namespace dptrain::distributed {
namespace {
// Each gradient starts on a 64-byte boundary inside the bucket buffer, as the kernels' Eigen maps
// expect of every tensor buffer.
constexpr int64_t kAlignFloats = 16;
int64_t aligned(int64_t n) {
  return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

// Inf and NaN are the floats whose exponent bits are all ones. An integer OR-reduction vectorises
// where a float accumulation would not (float addition is not associative).
inline uint32_t not_finite(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
}

// Multiplies by `scale` (unless 1) and reports whether every result is finite, in one pass.
bool scale_and_check(std::span<float> values, float scale) {
  uint32_t bad = 0;
  float* v = values.data();
  const int64_t n = static_cast<int64_t>(values.size());
  if (scale == 1.0f) {
    for (int64_t i = 0; i < n; ++i) bad |= not_finite(v[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      v[i] *= scale;
      bad |= not_finite(v[i]);
    }
  }
  return bad == 0;
}
}  // namespace

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::kNone;
  if (name == "fp16") return Compression::kFp16;
  if (name == "bf16") return Compression::kBf16;
  DPTRAIN_FAIL("unknown compression \"", name, "\"; use \"none\", \"fp16\" or \"bf16\"");
}

std::string to_string(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "none";
    case Compression::kFp16:
      return "fp16";
    case Compression::kBf16:
      return "bf16";
  }
  return "?";
}

GradientReducer::GradientReducer(Communicator& comm, std::vector<NamedTensor> parameters,
                                 ReducerOptions options)
    : comm_(comm), parameters_(std::move(parameters)), options_(options) {
  DPTRAIN_CHECK(options_.fusion_threshold_mb >= 0 && options_.first_bucket_mb >= 0,
                "distributed.fusion_threshold_mb and first_bucket_mb must be >= 0");
  const auto cap_elements = [](double mb) { return static_cast<int64_t>(mb * (1 << 20) / sizeof(float)); };
  const bool per_tensor = options_.fusion_threshold_mb == 0;
  std::vector<int64_t> slot(parameters_.size());
  bucket_of_.resize(parameters_.size());
  int64_t offset = 0;
  for (std::size_t k = parameters_.size(); k-- > 0;) {
    const int64_t n = aligned(parameters_[k].tensor.numel());
    // The first bucket stays small so that communication can start early in backward.
    const double cap_mb = buckets_.size() <= 1
                              ? std::min(options_.first_bucket_mb, options_.fusion_threshold_mb)
                              : options_.fusion_threshold_mb;
    const bool fits = !per_tensor && !buckets_.empty() && buckets_.back().numel + n <= cap_elements(cap_mb);
    if (!fits) buckets_.push_back({{}, offset, 0});
    buckets_.back().parameters.push_back(k);
    buckets_.back().numel += n;
    bucket_of_[k] = buckets_.size() - 1;
    slot[k] = offset;
    offset += n;
  }
  flat_ = make_storage(sizeof(float) * std::max<int64_t>(offset, 1));
  std::memset(flat_->data(), 0, flat_->bytes());  // padding must stay zero (and finite) forever
  for (std::size_t k = 0; k < parameters_.size(); ++k)
    parameters_[k].tensor.bind_grad(std::make_shared<Storage>(flat_, sizeof(float) * slot[k],
                                                              sizeof(float) * parameters_[k].tensor.numel()));
  if (options_.compression != Compression::kNone) flat_half_.resize(offset);
  for (const Bucket& bucket : buckets_)
    labels_.push_back("allreduce of gradient bucket " + std::to_string(labels_.size()) + " (" +
                      std::to_string(bucket.numel) + " elements, first parameter " +
                      parameters_[bucket.parameters.front()].name + ") at step ");
  pending_.resize(buckets_.size());
  launched_.assign(buckets_.size(), false);
  ready_count_.assign(buckets_.size(), 0);
  if (comm_.size() > 1 && options_.overlap) {
    for (std::size_t k = 0; k < parameters_.size(); ++k)
      parameters_[k].tensor.impl()->on_grad_ready = [this, k] { on_gradient_ready(k); };
  }
}

GradientReducer::~GradientReducer() {
  for (NamedTensor& p : parameters_) p.tensor.impl()->on_grad_ready = nullptr;
}

std::span<float> GradientReducer::window(std::size_t b) const {
  return {flat_->as<float>() + buckets_[b].offset, static_cast<std::size_t>(buckets_[b].numel)};
}

HalfFormat GradientReducer::half_format() const {
  return options_.compression == Compression::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16;
}

void GradientReducer::prepare(int64_t step) {
  step_ = step;
  armed_ = true;
  next_launch_ = 0;
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
}

void GradientReducer::on_gradient_ready(std::size_t parameter) {
  if (!armed_) return;  // an accumulation pass (backward_passes_per_step > 1)
  ++ready_count_[bucket_of_[parameter]];
  const auto next_is_complete = [&] {
    return next_launch_ < buckets_.size() &&
           ready_count_[next_launch_] == buckets_[next_launch_].parameters.size();
  };
  if (!next_is_complete()) return;  // most gradients: no clock read
  const auto start = std::chrono::steady_clock::now();
  while (next_is_complete()) {
    // The last bucket has nothing left to overlap with: reducing it here saves the hand-off to the
    // communication thread (which shares this rank's core).
    const bool last = next_launch_ + 1 == buckets_.size();
    launch(next_launch_++, /*async=*/!last);
  }
  times_.in_backward_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GradientReducer::launch(std::size_t b, bool async) {
  launched_[b] = true;
  const std::span<float> grads = window(b);
  const int index = static_cast<int>(b);
  const auto span_name = [&] {
    return timeline::enabled() ? "allreduce bucket " + std::to_string(b) : std::string();
  };
  if (options_.compression == Compression::kNone) {
    if (async) {
      pending_[b] = comm_.start_allreduce(grads, ReduceOp::kSum, label(b), span_name());
    } else {
      timeline::Span span("allreduce bucket ", "communication", index);
      comm_.allreduce(grads, ReduceOp::kSum, label(b));
    }
    return;
  }
  // Scaled by 1/N before the sum (not after) so the half-precision sum cannot overflow.
  const std::span<uint16_t> half(flat_half_.data() + buckets_[b].offset, grads.size());
  const float scale = options_.gradients_prescaled ? 1.0f : 1.0f / static_cast<float>(comm_.size());
  {
    timeline::Span span("compress bucket ", "communication", index);
    floats_to_halves(grads.data(), half.data(), static_cast<int64_t>(grads.size()), scale, half_format());
  }
  if (async) {
    pending_[b] = comm_.start_allreduce_half(half, half_format(), label(b), span_name());
  } else {
    timeline::Span span("allreduce bucket ", "communication", index);
    comm_.allreduce_half(half, half_format(), label(b));
  }
}

void GradientReducer::finish() {
  const auto start = std::chrono::steady_clock::now();
  armed_ = false;
  const float inv = 1.0f / static_cast<float>(comm_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const std::span<float> grads = window(b);
    const int64_t n = static_cast<int64_t>(grads.size());
    float scale = 1.0f;
    if (comm_.size() > 1) {
      // What backward did not launch (overlap off, or parameters that got no gradient) goes now, in
      // order: earlier buckets were launched first on every rank.
      if (!launched_[b]) {
        launch(b, /*async=*/false);
      } else if (pending_[b].active()) {
        timeline::Span span("wait for bucket ", "communication", static_cast<int>(b));
        comm_.wait(pending_[b]);
      }
      if (options_.compression == Compression::kNone) {
        if (!options_.gradients_prescaled) scale = inv;
      } else {
        timeline::Span span("decompress bucket ", "communication", static_cast<int>(b));
        halves_to_floats(flat_half_.data() + buckets_[b].offset, grads.data(), n, half_format());
      }
    }
    if (!options_.check_finite) {
      if (scale != 1.0f)
        for (float& g : grads) g *= scale;
      continue;
    }
    if (scale_and_check(grads, scale)) continue;
    for (std::size_t k : buckets_[b].parameters) {
      bool finite = true;
      for (float v : parameters_[k].tensor.grad()) finite &= std::isfinite(v);
      DPTRAIN_CHECK(finite, "non-finite averaged gradient in ", parameters_[k].name, " (bucket ", b,
                    ") at step ", step_, "; not applied. Lower optimizer.lr",
                    options_.compression != Compression::kNone
                        ? " or set distributed.compression to \"none\" (fp16 overflows past 65504)"
                        : "");
    }
  }
  // The next step may skip prepare() (no overlap): nothing counts as launched then.
  std::fill(launched_.begin(), launched_.end(), false);
  times_.finish_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace dptrain::distributed
