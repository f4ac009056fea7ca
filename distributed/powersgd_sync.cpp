// The "powersgd" gradient sync: the bucketed allreduce before powersgd.start_step, PowerSGD's
// low-rank approximation from then on (distributed/powersgd.h), and its state through checkpoints:
// Q (the same on every rank) and every rank's error buffer.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "distributed/gradient_sync.h"
#include "distributed/powersgd.h"
#include "distributed/reducer.h"

namespace dptrain::distributed {
namespace {

class PowerSgdSync : public GradientSync {
 public:
  explicit PowerSgdSync(const GradientSyncContext& c)
      : plain_(c.comm, c.parameters, reducer_options(c.options, "none")),
        powersgd_(c.comm, c.parameters, c.options.powersgd),
        host_comm_(c.host_comm),
        parameters_(c.parameters),
        options_(c.options),
        ranks_(c.comm.size()) {}

  int ranks_in_average() const override { return ranks_; }
  void begin_step(const StepShape& shape) override {
    step_ = shape.step;
    last_ = shape.micro_batches - 1;
    compressed_ = powersgd_.compresses(step_);
  }
  // Before start_step the buckets launch during the last backward; after it PowerSGD runs on the
  // whole gradient once backward is done.
  void before_backward(int64_t index) override {
    if (!compressed_ && index == last_) plain_.prepare(step_);
  }
  void finish_step() override { compressed_ ? powersgd_.reduce(step_) : plain_.finish(); }

  double take_seconds_in_backward() override { return plain_.take_seconds_in_backward(); }
  int64_t payload_bytes(int64_t step) const override {
    return static_cast<int64_t>(sizeof(float)) *
           (powersgd_.compresses(step) ? powersgd_.payload_elements() : parameters_.size());
  }
  std::vector<int64_t> bucket_bytes() const override { return plain_.bucket_bytes(); }
  std::string describe() const override;

  std::vector<NamedTensor> checkpoint_state() override;
  void resume_state(const StateLookup& find, const std::string& path) override;
  void share_state_from_rank0() override;

 private:
  GradientReducer plain_;
  PowerSgdReducer powersgd_;
  Communicator& host_comm_;
  const FlatParameters& parameters_;
  GradientSyncOptions options_;
  int ranks_;
  int64_t step_ = 0, last_ = 0;
  bool compressed_ = false;
  // Rank 0, resuming: every rank's error buffer as the checkpoint holds them, [ranks then, size],
  // handed out by share_state_from_rank0().
  Tensor resumed_errors_;
};

std::string PowerSgdSync::describe() const {
  const PowerSgdOptions& p = options_.powersgd;
  const int64_t compressed = static_cast<int64_t>(powersgd_.matrices().size()),
                tensors = static_cast<int64_t>(parameters_.parameters().size());
  char text[400];
  std::snprintf(
      text, sizeof text,
      "%s, compression powersgd\n"
      "powersgd: rank %lld from step %lld (plain allreduce before), %lld of %lld tensors compressed: "
      "%lld elements per step instead of %lld, %.1fx fewer",
      plain_.describe().c_str(), static_cast<long long>(p.rank), static_cast<long long>(p.start_step),
      static_cast<long long>(compressed), static_cast<long long>(tensors),
      static_cast<long long>(powersgd_.payload_elements()), static_cast<long long>(parameters_.size()),
      static_cast<double>(parameters_.size()) / static_cast<double>(powersgd_.payload_elements()));
  return text;
}

// Every rank's error buffer to rank 0, which writes them as [ranks, size]: a gather (MPI_Gather).
// An allgather gave every rank all of them (ResNet-50 on 64 ranks of one host: 6.5 GB a rank at every
// checkpoint); a broadcast from each rank in turn sent every one to every rank. A tree gather's
// inner ranks forward their subtree's buffers on the way. The other ranks return their own row
// alone: rank 0 alone writes the checkpoint.
std::vector<NamedTensor> PowerSgdSync::checkpoint_state() {
  const int64_t ranks = host_comm_.size(), size = parameters_.size();
  const bool root = host_comm_.rank() == 0;
  const std::span<const float> mine(powersgd_.error().data_ptr(), static_cast<std::size_t>(size));
  Tensor errors = Tensor::empty({root ? ranks : 1, size});  // every row written below
  if (!root) std::ranges::copy(mine, errors.data_ptr());
  host_comm_.gather(mine,
                    std::span<float>(errors.data_ptr(), root ? static_cast<std::size_t>(ranks * size) : 0), 0,
                    "gather of the ranks' PowerSGD error buffers for a checkpoint");
  return {{"powersgd.q", powersgd_.q()}, {"powersgd.error", errors}};
}

void PowerSgdSync::resume_state(const StateLookup& find, const std::string& path) {
  const Tensor* errors = find("powersgd.error");
  const Tensor* q = find("powersgd.q");
  // Errors have the flat gradient layout whatever the rank, written by however many ranks ran then.
  resumed_errors_ = Tensor();
  if (errors != nullptr && errors->ndim() == 2 && errors->dim(1) == parameters_.size()) {
    resumed_errors_ = errors->clone();
  } else if (errors != nullptr) {
    std::printf(
        "dptrain: %s: PowerSGD's error buffers do not fit this model's %lld gradient elements; "
        "errors start at zero\n",
        path.c_str(), static_cast<long long>(parameters_.size()));
  }
  const bool q_fits = q != nullptr && q->shape() == powersgd_.q().shape();
  if (q_fits) std::copy_n(q->data_ptr(), q->numel(), powersgd_.q().data_ptr());
  if (q == nullptr && errors == nullptr) {
    std::printf("dptrain: %s holds no PowerSGD state (written without it): Q from the seed, errors zero\n",
                path.c_str());
  } else if (!q_fits) {
    std::printf(
        "dptrain: %s: PowerSGD's Q was for another powersgd.rank or min_compression_rate; drawn "
        "afresh from the seed, error buffers kept\n",
        path.c_str());
  }
}

// Q goes to every rank; each error buffer to its rank, or (resumed on another number of ranks) their
// sum to rank 0, which is all the next step depends on.
void PowerSgdSync::share_state_from_rank0() {
  const Tensor& q = powersgd_.q();
  host_comm_.broadcast(std::span<float>(q.data_ptr(), static_cast<std::size_t>(q.numel())), 0,
                       "broadcast of PowerSGD's Q");
  int64_t saved_ranks = resumed_errors_.defined() ? resumed_errors_.dim(0) : 0;
  host_comm_.broadcast(std::span<int64_t>(&saved_ranks, 1), 0,
                       "broadcast of the ranks that wrote PowerSGD's errors");
  if (saved_ranks == 0) return;  // a fresh start: no error yet
  const int64_t size = parameters_.size();
  float* error = powersgd_.error().data_ptr();
  if (saved_ranks == host_comm_.size()) {
    // Row r to rank r: no rank holds more than its own row but rank 0.
    const bool root = host_comm_.rank() == 0;
    host_comm_.scatter(std::span<const float>(root ? resumed_errors_.data_ptr() : nullptr,
                                              root ? static_cast<std::size_t>(saved_ranks * size) : 0),
                       std::span<float>(error, static_cast<std::size_t>(size)), 0,
                       "scatter of the ranks' PowerSGD error buffers from the checkpoint");
  } else if (host_comm_.rank() == 0) {
    const float* saved = resumed_errors_.data_ptr();
    std::fill_n(error, size, 0.0f);
    for (int64_t r = 0; r < saved_ranks; ++r)
      for (int64_t i = 0; i < size; ++i) error[i] += saved[r * size + i];
    std::printf("dptrain: PowerSGD's error buffers of %lld rank(s) summed into rank 0's (%d rank(s) now)\n",
                static_cast<long long>(saved_ranks), host_comm_.size());
  }
  resumed_errors_ = Tensor();
}

}  // namespace

std::unique_ptr<GradientSync> make_powersgd_sync(const GradientSyncContext& context) {
  return std::make_unique<PowerSgdSync>(context);
}

}  // namespace dptrain::distributed
