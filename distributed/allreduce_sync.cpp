// The "allreduce" gradient sync: GradientReducer's bucketed allreduce, overlapped with the last
// backward pass of the step, in a registered wire encoding; or, with a sharded optimizer, its
// reduce-scatter and the all-gather of the updated parameters.
#include "distributed/gradient_encoding.h"
#include "distributed/gradient_sync.h"
#include "distributed/reducer.h"

namespace dptrain::distributed {
namespace {

class AllreduceSync : public GradientSync {
 public:
  explicit AllreduceSync(const GradientSyncContext& c)
      : reducer_(c.comm, c.parameters, reducer_options(c.options, c.options.encoding)),
        encoding_(c.options.encoding),
        payload_bytes_(gradient_encoding(c.options.encoding).bytes_per_element * c.parameters.size()),
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
  const int32_t* update_skip_flag() const override { return reducer_.non_finite_flag(); }
  void check_deferred() override { reducer_.check_non_finite_flag(); }

  const ShardLayout* optimizer_shard() const override { return reducer_.shard_layout(); }
  void after_update() override { reducer_.gather_parameters(); }

  double take_seconds_in_backward() override { return reducer_.take_seconds_in_backward(); }
  int64_t payload_bytes(int64_t /*step*/) const override { return payload_bytes_; }
  std::vector<int64_t> bucket_bytes() const override { return reducer_.bucket_bytes(); }
  std::string describe() const override {
    return ranks_ == 1 ? "" : reducer_.describe() + ", compression " + encoding_;
  }

 private:
  GradientReducer reducer_;
  std::string encoding_;
  int64_t payload_bytes_;  // the whole flat gradient in the encoding
  int ranks_;
  int64_t step_ = 0, last_ = 0;
};

}  // namespace

std::unique_ptr<GradientSync> make_allreduce_sync(const GradientSyncContext& context) {
  return std::make_unique<AllreduceSync>(context);
}

}  // namespace dptrain::distributed
