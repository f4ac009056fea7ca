// What data parallelism guarantees, checked where it is decided: the gradient that N ranks average
// over their slices of a global batch equals the gradient of the whole batch on one rank, to float
// rounding, for the MNIST CNN and MLP (every layer kind the configs use).
//
// Both gradients are means over the same B samples of per-sample gradients; they differ only in the
// order the B contributions are added (inside each rank's GEMMs, then across ranks in the
// allreduce). Each element's rounding error is then a sum of B independent errors of relative size
// u = 2^-24 of its terms, so a tensor's error relative to its norm concentrates around sqrt(B) u
// (measured: 7e-8 to 2e-7 here). The limit, 1e-5 of the tensor's norm, is 25x that and holds on any
// machine; a real fault is far beyond it: dividing by the wrong count or dropping one rank's slice
// changes a gradient by at least 1/N of its norm (25% at 4 ranks), a wrong slice by about 100%.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/rng.h"
#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "distributed/reducer.h"
#include "layers/build.h"
#include "mpi_test_env.h"

namespace dptrain::distributed {
namespace {

constexpr double kLimit = 1e-5;
constexpr int64_t kGlobalBatch = 64;

const char* const kCnn = R"([
  {"type": "conv2d", "out_channels": 8, "kernel": 3}, {"type": "relu"}, {"type": "maxpool2d", "kernel": 2},
  {"type": "conv2d", "out_channels": 16, "kernel": 3, "padding": 1}, {"type": "tanh"},
  {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "dense", "out_features": 32},
  {"type": "sigmoid"}, {"type": "dense", "out_features": 10}])";
const char* const kMlp = R"([
  {"type": "flatten"}, {"type": "dense", "out_features": 128}, {"type": "relu"},
  {"type": "dense", "out_features": 10}])";

struct Batch {
  std::vector<float> inputs;  // kGlobalBatch samples of [1, 14, 14]
  std::vector<int32_t> labels;
};

Batch random_batch(uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.inputs.resize(kGlobalBatch * 14 * 14);
  for (float& v : b.inputs) v = rng.uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < kGlobalBatch; ++i) b.labels.push_back(static_cast<int32_t>(rng.below(10)));
  return b;
}

// The mean cross-entropy gradient of samples [first, first + count) of `batch`, seeded with `seed`.
void backward_on(layers::Sequential& model, const Batch& batch, int64_t first, int64_t count, float seed) {
  const int64_t sample = 14 * 14;
  const Tensor x = Tensor::from_data(
      {count, 1, 14, 14}, std::span<const float>(batch.inputs).subspan(first * sample, count * sample));
  const std::span<const int32_t> labels = std::span<const int32_t>(batch.labels).subspan(first, count);
  ops::cross_entropy(model.forward(x), labels).backward(seed);
}

void expect_averaged_gradient_equals_large_batch_gradient(const char* layers_json) {
  autograd::clear_tape();
  MpiCommunicator comm(test::world());
  const Json layers = Json::parse(layers_json);
  const Batch batch = random_batch(2024);  // the same global batch on every rank

  // One rank, the whole batch.
  auto whole = layers::build_sequential(layers, {1, 14, 14}, /*seed=*/7);
  backward_on(*whole, batch, 0, kGlobalBatch, 1.0f);

  // This rank's slice of it, averaged over the ranks as the trainer does.
  auto sliced = layers::build_sequential(layers, {1, 14, 14}, /*seed=*/7);
  const FlatParameters flat(sliced->named_parameters(), Device::cpu());
  GradientReducer reducer(comm, flat, {.fusion_threshold_mb = 0.01, .first_bucket_mb = 0.001});
  const int64_t per_rank = kGlobalBatch / comm.size();
  reducer.prepare(0);
  backward_on(*sliced, batch, comm.rank() * per_rank, per_rank, reducer.loss_scale(1));
  reducer.finish();

  const std::vector<NamedTensor> expected = whole->named_parameters(), averaged = sliced->named_parameters();
  for (std::size_t k = 0; k < expected.size(); ++k) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < expected[k].tensor.numel(); ++i) {
      const double e = expected[k].tensor.grad()[i], a = averaged[k].tensor.grad()[i];
      diff += (a - e) * (a - e);
      norm += e * e;
    }
    const double relative = std::sqrt(diff / norm);
    if (test::rank() == 0)
      std::printf("  %-9s ||averaged - whole batch|| / ||whole batch|| = %.2e (%d rank(s))\n",
                  expected[k].name.c_str(), relative, comm.size());
    EXPECT_LE(relative, kLimit) << expected[k].name;
  }
}

TEST(DataParallel, AveragedGradientEqualsLargeBatchGradientCnn) {
  expect_averaged_gradient_equals_large_batch_gradient(kCnn);
}

TEST(DataParallel, AveragedGradientEqualsLargeBatchGradientMlp) {
  expect_averaged_gradient_equals_large_batch_gradient(kMlp);
}

}  // namespace
}  // namespace dptrain::distributed
