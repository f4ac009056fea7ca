// The "allreduce" gradient sync: GradientReducer's bucketed allreduce, overlapped with the last
// backward pass of the step, in a registered wire encoding.
#include <cstdio>

#include "distributed/gradient_sync.h"
#include "distributed/reducer.h"

namespace dptrain::distributed {
namespace {

class AllreduceSync : public GradientSync {
 public:
  explicit AllreduceSync(const GradientSyncContext& c)
      : reducer_(c.comm, c.parameters,
                 {.fusion_threshold_mb = c.options.fusion_threshold_mb,
                  .first_bucket_mb = c.options.first_bucket_mb,
                  .overlap = c.options.overlap,
                  .encoding = c.options.encoding,
                  .check_finite = c.options.check_finite}),
        options_(c.options),
        elements_(c.parameters.size()),
        ranks_(c.comm.size()) {}

  int ranks_in_average() const override { return ranks_; }
  void begin_step(const StepShape& shape) override {
    step_ = shape.step;
    last_ = shape.micro_batches - 1;
  }
  // Buckets launch during the step's last backward; earlier passes only accumulate.
  void before_backward(int64_t index) override {
    if (index == last_) reducer_.prepare(step_);
  }
  void finish_step() override { reducer_.finish(); }

  double take_seconds_in_backward() override { return reducer_.take_times().in_backward_s; }
  int64_t payload_bytes(int64_t /*step*/) const override {
    return gradient_encoding(options_.encoding).bytes_per_element * elements_;
  }
  std::vector<int64_t> bucket_bytes() const override {
    std::vector<int64_t> bytes;
    for (const Bucket& b : reducer_.buckets()) bytes.push_back(b.numel * static_cast<int64_t>(sizeof(float)));
    return bytes;
  }
  std::string describe() const override {
    if (ranks_ == 1) return "";
    char text[160];
    std::snprintf(text, sizeof text, "%zu bucket(s), fusion threshold %g MiB, overlap %s, compression %s",
                  reducer_.buckets().size(), options_.fusion_threshold_mb, options_.overlap ? "on" : "off",
                  options_.encoding.c_str());
    return text;
  }

 private:
  GradientReducer reducer_;
  GradientSyncOptions options_;
  int64_t elements_;
  int ranks_;
  int64_t step_ = 0, last_ = 0;
};

}  // namespace

std::unique_ptr<GradientSync> make_allreduce_sync(const GradientSyncContext& context) {
  return std::make_unique<AllreduceSync>(context);
}

}  // namespace dptrain::distributed
