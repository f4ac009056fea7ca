// The "exact_sum" gradient sync of distributed.deterministic: each micro-batch's gradients summed in
// 64-bit fixed point (distributed/exact_sum.h), so the average has the same bits on any number of
// ranks.
#include <cstdio>

#include "distributed/exact_sum.h"
#include "distributed/gradient_sync.h"

namespace dptrain::distributed {
namespace {

class ExactSumSync : public GradientSync {
 public:
  explicit ExactSumSync(const GradientSyncContext& c)
      : sum_(c.comm, c.parameters, c.options.shard_optimizer),
        comm_(c.comm),
        parameters_(c.parameters),
        micro_batch_samples_(c.options.micro_batch_samples),
        ranks_(c.comm.size()) {}

  int ranks_in_average() const override { return ranks_; }
  void begin_step(const StepShape& shape) override {
    sum_.begin(shape.step, shape.global_micro_batches, shape.micro_batches);
  }
  // Each micro-batch's gradients are taken on their own: the sum, not backward, accumulates them.
  void before_backward(int64_t index) override {
    if (index > 0) parameters_.zero_grad();
  }
  void after_backward(int64_t /*index*/) override { sum_.add_micro_batch(); }
  void finish_step() override { sum_.finish(); }
  const ShardLayout* optimizer_shard() const override { return sum_.shard_layout(); }
  void after_update() override {
    if (sum_.shard_layout() != nullptr)
      sum_.shard_layout()->allgather(comm_, parameters_.values().data_ptr(),
                                     "all-gather of the updated parameters");
  }

  int64_t payload_bytes(int64_t /*step*/) const override {
    return static_cast<int64_t>(sizeof(int64_t)) * parameters_.size();
  }
  std::string describe() const override {
    char text[128];
    std::snprintf(text, sizeof text,
                  "deterministic, micro-batches of %lld samples summed in 64-bit fixed point",
                  static_cast<long long>(micro_batch_samples_));
    if (sum_.shard_layout() == nullptr) return text;
    return text + std::string(", optimizer sharded over ") + std::to_string(ranks_) +
           " rank(s) (reduce-scatter of the sums, all-gather of the parameters)";
  }

 private:
  ExactGradientSum sum_;
  Communicator& comm_;
  const FlatParameters& parameters_;
  int64_t micro_batch_samples_;
  int ranks_;
};

}  // namespace

std::unique_ptr<GradientSync> make_exact_sum_sync(const GradientSyncContext& context) {
  return std::make_unique<ExactSumSync>(context);
}

}  // namespace dptrain::distributed
