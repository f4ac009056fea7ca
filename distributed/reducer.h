// GradientReducer: averages parameter gradients across ranks after backward. Parameters are
// grouped into static buckets in reverse registration order (the order backward produces them): a
// small first bucket, then buckets up to the fusion threshold. Gradients live inside the bucket
// buffer (each parameter's gradient is a window of it), so reducing a bucket copies nothing. With
// overlap on, a bucket's allreduce is queued on the communication thread from the gradient-ready
// hook of its last parameter while backward goes on; buckets always launch in index order, so every
// rank issues identical collectives. fp16/bf16 compression reduces a separate half buffer,
// pre-scaled by 1/N so the half-precision sum cannot overflow.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

enum class Compression { kNone, kFp16, kBf16 };

Compression parse_compression(const std::string& name);  // "none" | "fp16" | "bf16"
std::string to_string(Compression compression);

struct ReducerOptions {
  double fusion_threshold_mb = 4;  // 0: one allreduce per tensor
  double first_bucket_mb = 1;
  bool overlap = true;
  Compression compression = Compression::kNone;
  // The caller has already divided every gradient by the world size (the trainer seeds backward
  // with 1/N, which costs nothing), so finish() only sums; otherwise finish() divides.
  bool gradients_prescaled = false;
  // Stop with an error naming the step, bucket and parameter when an average is Inf or NaN. Costs
  // one read of the gradients per step (on this shared-memory machine ~10% of the allreduce itself;
  // next to a network allreduce, nothing).
  bool check_finite = true;
};

// Time the calling thread spent in the reducer since the last take_times(): communication and
// averaging that did not overlap with compute.
struct ReducerTimes {
  double in_backward_s = 0;  // compressing and reducing buckets from inside backward's hooks
  double finish_s = 0;       // finish(): waiting, the rest of the buckets, decompression, checks
};

struct Bucket {
  std::vector<std::size_t> parameters;  // indices into the parameter list, in backward order
  int64_t offset = 0;                   // first element in the flat buffer
  int64_t numel = 0;                    // elements it spans, alignment padding included
};

class GradientReducer {
 public:
  // Binds every parameter's gradient to its place in the bucket buffer (values are kept).
  GradientReducer(Communicator& comm, std::vector<NamedTensor> parameters, ReducerOptions options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the hooks for the next backward pass (the last one of a step); `step` labels messages.
  void prepare(int64_t step);
  // Reduces the buckets backward did not launch, waits for all, leaves the averages in the
  // gradients. Throws if an average is not finite (naming the step, bucket and parameter).
  void finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  ReducerTimes take_times() { return std::exchange(times_, {}); }

 private:
  void on_gradient_ready(std::size_t parameter);
  void launch(std::size_t bucket, bool async);
  std::span<float> window(std::size_t bucket) const;
  std::string label(std::size_t bucket) const { return labels_[bucket] + std::to_string(step_); }
  HalfFormat half_format() const;

  Communicator& comm_;
  std::vector<NamedTensor> parameters_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter index -> bucket
  std::vector<std::string> labels_;     // "allreduce of gradient bucket 3 (...) at step "
  StoragePtr flat_;                     // every gradient, bucket after bucket
  std::vector<uint16_t> flat_half_;     // fp16/bf16 staging
  std::vector<Pending> pending_;        // per bucket
  std::vector<bool> launched_;
  std::vector<std::size_t> ready_count_;
  std::size_t next_launch_ = 0;
  bool armed_ = false;
  int64_t step_ = 0;
  ReducerTimes times_;
};

}  // namespace dptrain::distributed
