// The "local" gradient sync: no averaging at all; every rank steps on its own gradients. It is the
// compute-only baseline of a scaling experiment: N ranks with communication taken out, the ceiling
// that the allreduce's throughput is compared against. The ranks' models drift apart, so the
// checkpoints and final weights are rank 0's and the metrics mix N models; not for training runs.
#include "distributed/gradient_sync.h"

namespace dptrain::distributed {
namespace {

class LocalSync : public GradientSync {
 public:
  explicit LocalSync(const GradientSyncContext& /*context*/) {}

  int ranks_in_average() const override { return 1; }
  void begin_step(const StepShape& /*shape*/) override {}
  void finish_step() override {}
  int64_t payload_bytes(int64_t /*step*/) const override { return 0; }
  std::string describe() const override {
    return "local: no averaging, every rank steps on its own gradients (a compute-only baseline)";
  }
};

}  // namespace

std::unique_ptr<GradientSync> make_local_sync(const GradientSyncContext& context) {
  return std::make_unique<LocalSync>(context);
}

}  // namespace dptrain::distributed
