// GradientReducer: averages parameter gradients across ranks after backward. The gradients live in
// one flat buffer (core/parameters.h) laid out in reverse registration order, the order backward
// produces them; static buckets are contiguous ranges of it: a small first bucket, then buckets up to
// the fusion threshold. Reducing a bucket therefore copies nothing. With overlap on, a bucket's
// allreduce is started from the gradient-ready hook of its last parameter while backward goes on;
// buckets always launch in index order, so every rank issues identical collectives. A wire encoding
// other than "none" (distributed/gradient_encoding.h) reduces a separate buffer in its own format.
//
// Averaging: the allreduce sums, and the sum is the average because every rank seeds backward with
// loss_scale(passes) = 1 / (passes x ranks), which costs nothing (the trainer's step takes the ranks
// from GradientSync::ranks_in_average). Dividing before the sum (not after) is also what keeps a
// half-precision sum from overflowing.
//
// With `shard` (ZeRO-1, distributed.shard_optimizer) each bucket is reduce-scattered instead
// (distributed/shard_layout.h): finish() leaves the average only in this rank's chunks of the buckets,
// the optimizer updates those, and gather_parameters() all-gathers the new values, bucket by bucket.
// The same bytes on the wire as the allreduce, in the same buckets and with the same overlap.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/parameters.h"
#include "distributed/communicator.h"
#include "distributed/gradient_encoding.h"
#include "distributed/shard_layout.h"

namespace dptrain::distributed {

struct ReducerOptions {
  double fusion_threshold_mb = 4;  // 0: one allreduce per tensor
  double first_bucket_mb = 1;
  bool overlap = true;
  std::string encoding = "none";  // a registered wire encoding (distributed/gradient_encoding.h)
  // Stop with an error naming the step, bucket and parameter when an average is Inf or NaN. Ranks
  // that reduce in shared memory test the sums as they make them, at no cost; otherwise it costs one
  // read of the gradients per step (next to a network allreduce, nothing).
  bool check_finite = true;
  // Reduce-scatter the buckets and leave the update of each chunk to its rank (see above).
  bool shard = false;
};

struct Bucket {
  std::vector<std::size_t> parameters;  // indices into the parameter list, in backward order
  int64_t offset = 0;                   // first element in the flat gradient buffer
  int64_t numel = 0;                    // elements it spans, alignment padding included
};

class GradientReducer {
 public:
  GradientReducer(Communicator& comm, const FlatParameters& parameters, ReducerOptions options);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // What backward of each pass's loss must be seeded with so that finish() leaves the average over
  // `passes` accumulated passes on every rank: 1 / (passes x ranks).
  float loss_scale(int64_t passes) const;
  // Arms the hooks for the next backward pass (the last one of a step); `step` labels messages.
  void prepare(int64_t step);
  // Reduces the buckets backward did not launch, waits for all, leaves the averages in the
  // gradients. Throws if an average is not finite (naming the step, bucket and parameter); on a GPU
  // the check does not wait: it flags the step on the device (non_finite_flag), and
  // check_non_finite_flag() throws later, where the host synchronizes anyway.
  void finish();
  // An int32 in the gradients' device memory: 0, or 1 + the first step whose average was not finite.
  // The optimizer skips its update while it is set. Null on the host or without check_finite.
  const int32_t* non_finite_flag() const;
  void check_non_finite_flag();

  // With `shard`: which chunks of the flat buffers finish() leaves the average in (this rank's), or
  // null.
  const ShardLayout* shard_layout() const { return shard_ ? &*shard_ : nullptr; }
  // With `shard`, after the update of this rank's chunks: every rank's new parameter values to every
  // rank (an in-place all-gather per bucket).
  void gather_parameters();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  std::vector<int64_t> bucket_bytes() const;  // of the fp32 gradients, in launch order
  // "3 bucket(s), fusion threshold 4 MiB, overlap on": for the run's summary.
  std::string describe() const;
  // Seconds the calling thread spent compressing and reducing buckets from inside backward's hooks
  // since the last call: communication that did not overlap with compute. (finish() is timed by
  // its caller.)
  double take_seconds_in_backward() { return std::exchange(seconds_in_backward_, 0.0); }

 private:
  void on_gradient_ready(std::size_t parameter);
  void launch(std::size_t bucket, bool async);
  void launch_reduce_scatter(std::size_t bucket, void* wire, bool async);
  // This rank's chunk and the tail of a bucket (the ranges finish() completes), or the whole bucket.
  std::vector<FlatRange> completed_ranges(std::size_t bucket) const;
  // The first non-finite average a rank found: its bucket and parameter (-1: none).
  struct NonFinite {
    int64_t bucket = -1, parameter = -1;
  };
  std::string describe(NonFinite found) const;  // the error that names it
  // With `shard`, after the local checks: every rank learns the highest rank that found a
  // non-finite average in its chunks, and what it found; all of them throw naming it.
  void agree_on_finite(NonFinite found);
  std::span<float> window(std::size_t bucket) const;
  std::string label(std::size_t bucket) const { return labels_[bucket] + std::to_string(step_); }
  void* wire_window(std::size_t bucket) const;

  Communicator& comm_;
  const FlatParameters& parameters_;
  Backend& backend_;
  ReducerOptions options_;
  const GradientEncoding& encoding_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter index -> bucket
  std::vector<std::string> labels_;     // "allreduce of gradient bucket 3 (...) at step "
  StoragePtr wire_;                     // a compressing encoding's buffer, the gradient buffer's layout
  StoragePtr non_finite_flag_;          // one int32 (non_finite_flag) on a device
  std::optional<ShardLayout> shard_;
  std::vector<Pending> pending_;       // per bucket
  std::vector<Pending> pending_tail_;  // per bucket, with `shard`: the tail's allreduce
  std::vector<bool> launched_;
  // Per bucket: whether its sum was tested for Inf and NaN by the communicator (start_sum_testing_finite)
  // this step, and the answer, which the communication thread writes.
  std::vector<bool> tested_in_sum_;
  std::unique_ptr<bool[]> sum_finite_;
  std::vector<std::size_t> ready_count_;
  std::size_t next_launch_ = 0;
  bool armed_ = false;
  int64_t step_ = 0;
  double seconds_in_backward_ = 0;
  std::vector<GradHook> hooks_;  // last: removed before anything they call is destroyed
};

}  // namespace dptrain::distributed
