// Bucketed, overlapped gradient averaging over the flat gradient buffer.
#include "distributed/reducer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>

#include "core/backend.h"
#include "core/error.h"
#include "core/timeline.h"

namespace dptrain::distributed {

GradientReducer::GradientReducer(Communicator& comm, const FlatParameters& parameters, ReducerOptions options)
    : comm_(comm),
      parameters_(parameters),
      backend_(backend_for(parameters.device())),
      options_(std::move(options)),
      encoding_(gradient_encoding(options_.encoding)) {
  DPTRAIN_CHECK(options_.fusion_threshold_mb >= 0 && options_.first_bucket_mb >= 0,
                "distributed.fusion_threshold_mb and first_bucket_mb must be >= 0");
  DPTRAIN_CHECK(comm_.accepts(parameters_.device()), "the communicator cannot reduce gradients in ",
                parameters_.device().str(), " memory");
  DPTRAIN_CHECK(!encoding_.host_only || parameters_.device().is_host(), "distributed.compression = \"",
                encoding_.name, "\" runs on the CPU in this version, not on ", parameters_.device().str(),
                "; use \"fp16\", \"bf16\" or \"none\"");
  const auto cap_elements = [](double mb) { return static_cast<int64_t>(mb * (1 << 20) / sizeof(float)); };
  const bool per_tensor = options_.fusion_threshold_mb == 0;
  const std::size_t count = parameters_.parameters().size();
  bucket_of_.resize(count);
  // The flat layout runs from the last parameter to the first; each one spans up to the next.
  for (std::size_t k = count; k-- > 0;) {
    const int64_t n = (k == 0 ? parameters_.size() : parameters_.offset(k - 1)) - parameters_.offset(k);
    // The first bucket stays small so that communication can start early in backward.
    const double cap_mb = buckets_.size() <= 1
                              ? std::min(options_.first_bucket_mb, options_.fusion_threshold_mb)
                              : options_.fusion_threshold_mb;
    const bool fits = !per_tensor && !buckets_.empty() && buckets_.back().numel + n <= cap_elements(cap_mb);
    if (!fits) buckets_.push_back({{}, parameters_.offset(k), 0});
    buckets_.back().parameters.push_back(k);
    buckets_.back().numel += n;
    bucket_of_[k] = buckets_.size() - 1;
  }
  if (encoding_.encode != nullptr)
    wire_ = comm_.allocate_reduction_buffer(
        static_cast<std::size_t>(encoding_.bytes_per_element) *
            static_cast<std::size_t>(std::max<int64_t>(parameters_.size(), 1)),
        parameters_.device());
  if (options_.shard) {
    std::vector<FlatRange> windows;
    for (const Bucket& bucket : buckets_) windows.push_back({bucket.offset, bucket.numel});
    shard_.emplace(std::move(windows), comm_.size(), comm_.rank());
  }
  for (const Bucket& bucket : buckets_)
    labels_.push_back((shard_ ? "reduce-scatter" : "allreduce") + std::string(" of gradient bucket ") +
                      std::to_string(labels_.size()) + " (" + std::to_string(bucket.numel) +
                      " elements, first parameter " +
                      parameters_.parameters()[bucket.parameters.front()].name + ") at step ");
  if (options_.check_finite && !parameters_.device().is_host()) {
    non_finite_flag_ = make_storage(sizeof(int32_t), parameters_.device());
    const int32_t zero = 0;
    backend_.copy_from_host(non_finite_flag_->as<int32_t>(), &zero, sizeof zero);
  }
  pending_.resize(buckets_.size());
  pending_tail_.resize(buckets_.size());
  launched_.assign(buckets_.size(), false);
  tested_in_sum_.assign(buckets_.size(), false);
  sum_finite_ = std::make_unique<bool[]>(buckets_.size());
  ready_count_.assign(buckets_.size(), 0);
  if (comm_.size() > 1 && options_.overlap) {
    for (std::size_t k = 0; k < count; ++k)
      hooks_.push_back(parameters_.parameters()[k].tensor.on_grad_ready([this, k] { on_gradient_ready(k); }));
  }
}

const int32_t* GradientReducer::non_finite_flag() const {
  return non_finite_flag_ ? non_finite_flag_->as<int32_t>() : nullptr;
}

void GradientReducer::check_non_finite_flag() {
  if (!non_finite_flag_) return;
  int32_t flagged = 0;
  backend_.copy_to_host(&flagged, non_finite_flag_->as<int32_t>(), sizeof flagged);
  if (flagged == 0) return;
  // The gradients now are the last step's: a parameter is named if they are still not finite.
  std::string culprit;
  for (std::size_t k = 0; k < parameters_.parameters().size() && culprit.empty(); ++k)
    if (!backend_.all_finite(parameters_.grads().data_ptr() + parameters_.offset(k),
                             parameters_.parameters()[k].tensor.numel()))
      culprit = " (at step " + std::to_string(step_) + " still in " + parameters_.parameters()[k].name + ")";
  DPTRAIN_FAIL("non-finite averaged gradient at step ", flagged - 1, culprit,
               "; not applied, nor any update after it. Lower optimizer.lr", encoding_.overflow_hint);
}

std::vector<int64_t> GradientReducer::bucket_bytes() const {
  std::vector<int64_t> bytes;
  for (const Bucket& b : buckets_) bytes.push_back(b.numel * static_cast<int64_t>(sizeof(float)));
  return bytes;
}

std::string GradientReducer::describe() const {
  char text[128];
  std::snprintf(text, sizeof text, "%zu bucket(s), fusion threshold %g MiB, overlap %s%s", buckets_.size(),
                options_.fusion_threshold_mb, options_.overlap ? "on" : "off",
                comm_.reduces_in_shared_memory(wire_ ? wire_->data() : parameters_.grads().data_ptr())
                    ? ", in shared memory"
                    : "");
  if (!shard_) return text;
  return text + std::string(", optimizer sharded over ") + std::to_string(comm_.size()) +
         " rank(s) (reduce-scatter, update of this rank's 1/" + std::to_string(comm_.size()) +
         ", all-gather of the parameters" +
         (comm_.reduces_in_shared_memory(parameters_.values().data_ptr()) ? " in shared memory)" : ")");
}

float GradientReducer::loss_scale(int64_t passes) const {
  return 1.0f / static_cast<float>(passes * comm_.size());
}

std::span<float> GradientReducer::window(std::size_t b) const {
  return {parameters_.grads().data_ptr() + buckets_[b].offset, static_cast<std::size_t>(buckets_[b].numel)};
}

void* GradientReducer::wire_window(std::size_t b) const {
  return wire_->as<char>() + buckets_[b].offset * encoding_.bytes_per_element;
}

void GradientReducer::prepare(int64_t step) {
  step_ = step;
  armed_ = true;
  next_launch_ = 0;
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
  std::fill(tested_in_sum_.begin(), tested_in_sum_.end(), false);
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
  seconds_in_backward_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GradientReducer::launch(std::size_t b, bool async) {
  launched_[b] = true;
  const std::span<float> grads = window(b);
  const int index = static_cast<int>(b);
  const auto span_name = [&] {
    return timeline::enabled() ? "allreduce bucket " + std::to_string(b) : std::string();
  };
  void* wire = grads.data();
  if (encoding_.encode != nullptr) {
    wire = wire_window(b);
    timeline::Span span("compress bucket ", "communication", index);
    encoding_.encode(backend_, grads.data(), wire, static_cast<int64_t>(grads.size()));
  }
  if (shard_) {
    launch_reduce_scatter(b, wire, async);
    return;
  }
  // Where the communicator tests the sums for Inf and NaN as it makes them, finish() need not read
  // the bucket again.
  if (encoding_.encode == nullptr && options_.check_finite) {
    std::optional<Pending> started;
    if (async) {
      started = comm_.start_sum_testing_finite(grads, &sum_finite_[b], label(b), span_name(), false);
    } else {
      timeline::Span span("allreduce bucket ", "communication", index);
      started = comm_.start_sum_testing_finite(grads, &sum_finite_[b], label(b), {}, true);
    }
    if (started) {
      pending_[b] = std::move(*started);
      tested_in_sum_[b] = true;
      return;
    }
  }
  if (async) {
    pending_[b] = comm_.start_allreduce_elements(wire, grads.size(), encoding_.wire_type, ReduceOp::kSum,
                                                 label(b), span_name());
  } else {
    timeline::Span span("allreduce bucket ", "communication", index);
    comm_.allreduce_elements(wire, grads.size(), encoding_.wire_type, ReduceOp::kSum, label(b));
  }
}

void GradientReducer::launch_reduce_scatter(std::size_t b, void* wire, bool async) {
  const ShardLayout& layout = *shard_;
  const FlatRange tail = layout.tail(b);
  char* bytes = static_cast<char*>(wire);
  if (layout.chunk(b) > 0)
    pending_[b] = comm_.start_reduce_scatter_elements(
        bytes, static_cast<std::size_t>(layout.chunk(b)), encoding_.wire_type, ReduceOp::kSum, label(b),
        timeline::enabled() ? "reduce-scatter bucket " + std::to_string(b) : std::string());
  if (tail.numel > 0)
    pending_tail_[b] = comm_.start_allreduce_elements(
        bytes + (tail.offset - buckets_[b].offset) * encoding_.bytes_per_element,
        static_cast<std::size_t>(tail.numel), encoding_.wire_type, ReduceOp::kSum, "tail of the " + label(b),
        {});
  if (async) return;
  if (pending_[b].active()) comm_.wait(pending_[b]);
  if (pending_tail_[b].active()) comm_.wait(pending_tail_[b]);
}

std::vector<FlatRange> GradientReducer::completed_ranges(std::size_t b) const {
  if (!shard_) return {{buckets_[b].offset, buckets_[b].numel}};
  return {shard_->chunk_of(b, comm_.rank()), shard_->tail(b)};
}

void GradientReducer::gather_parameters() {
  if (!shard_ || comm_.size() == 1) return;
  timeline::Span span("all-gather parameters", "communication");
  shard_->allgather(comm_, parameters_.values().data_ptr(),
                    "all-gather of the updated parameters at step " + std::to_string(step_));
}

std::string GradientReducer::describe(NonFinite found) const {
  return "non-finite averaged gradient in " +
         parameters_.parameters()[static_cast<std::size_t>(found.parameter)].name + " (bucket " +
         std::to_string(found.bucket) + ") at step " + std::to_string(step_) +
         "; not applied. Lower optimizer.lr" + encoding_.overflow_hint;
}

void GradientReducer::agree_on_finite(NonFinite found) {
  if (non_finite_flag_) {  // a device: the flags' maximum, without waiting on the host
    Pending pending = comm_.start_allreduce_elements(non_finite_flag_->as<int32_t>(), 1, DataType::kI32,
                                                     ReduceOp::kMax, "agreement on finite gradients", {});
    comm_.wait(pending);
    return;
  }
  // (rank + 1, bucket, parameter) in one integer: the maximum is the highest rank's finding, whole, so
  // that every rank can name the parameter (the others would know only whose shard it was in).
  constexpr int kFieldBits = 24;
  constexpr int64_t kField = int64_t{1} << kFieldBits;
  DPTRAIN_CHECK(static_cast<int64_t>(buckets_.size()) < kField &&
                    static_cast<int64_t>(parameters_.parameters().size()) < kField,
                "the finiteness agreement encodes buckets and parameters in ", kFieldBits, " bits each");
  int64_t encoded = found.parameter < 0 ? 0
                                        : ((int64_t{comm_.rank()} + 1) << (2 * kFieldBits)) |
                                              (found.bucket << kFieldBits) | found.parameter;
  comm_.allreduce(std::span<int64_t>(&encoded, 1), ReduceOp::kMax,
                  "agreement on finite gradients at step " + std::to_string(step_));
  if (encoded == 0) return;
  const NonFinite agreed{(encoded >> kFieldBits) & (kField - 1), encoded & (kField - 1)};
  DPTRAIN_FAIL(describe(agreed), " (found in rank ", (encoded >> (2 * kFieldBits)) - 1,
               "'s shard of the gradients, distributed.shard_optimizer)");
}

void GradientReducer::finish() {
  armed_ = false;
  NonFinite found;  // the first non-finite average this rank found
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (comm_.size() > 1) {
      // What backward did not launch (overlap off, or parameters that got no gradient) goes now, in
      // order: earlier buckets were launched first on every rank.
      if (!launched_[b]) {
        launch(b, /*async=*/false);
      } else {
        timeline::Span span("wait for bucket ", "communication", static_cast<int>(b));
        if (pending_[b].active()) comm_.wait(pending_[b]);
        if (pending_tail_[b].active()) comm_.wait(pending_tail_[b]);
      }
      if (encoding_.decode != nullptr) {
        timeline::Span span("decompress bucket ", "communication", static_cast<int>(b));
        for (const FlatRange& r : completed_ranges(b))
          encoding_.decode(backend_, wire_->as<char>() + r.offset * encoding_.bytes_per_element,
                           parameters_.grads().data_ptr() + r.offset, r.numel);
      }
    }
    if (!options_.check_finite || (tested_in_sum_[b] && sum_finite_[b])) continue;
    for (const FlatRange& r : completed_ranges(b)) {
      float* g = parameters_.grads().data_ptr() + r.offset;
      if (non_finite_flag_) {  // a device: no wait here for a flag that is almost never set
        const auto marker =
            static_cast<int32_t>(std::min<int64_t>(step_ + 1, std::numeric_limits<int32_t>::max()));
        backend_.mark_non_finite(g, r.numel, non_finite_flag_->as<int32_t>(), marker);
        continue;
      }
      if (found.parameter >= 0 || backend_.all_finite(g, r.numel)) continue;
      // Name the culprit: the bucket's parameters one by one, where this rank holds the average.
      for (std::size_t k : buckets_[b].parameters) {
        const int64_t first = std::max(r.offset, parameters_.offset(k)),
                      end = std::min(r.end(),
                                     parameters_.offset(k) + parameters_.parameters()[k].tensor.numel());
        if (first < end && !backend_.all_finite(parameters_.grads().data_ptr() + first, end - first)) {
          found = {static_cast<int64_t>(b), static_cast<int64_t>(k)};
          break;
        }
      }
    }
  }
  if (shard_ && options_.check_finite && comm_.size() > 1)
    agree_on_finite(found);
  else
    DPTRAIN_CHECK(found.parameter < 0, describe(found));
  // The next step may skip prepare() (no overlap): nothing counts as launched then.
  std::fill(launched_.begin(), launched_.end(), false);
  std::fill(tested_in_sum_.begin(), tested_in_sum_.end(), false);
}

}  // namespace dptrain::distributed
