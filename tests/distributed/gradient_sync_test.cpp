// GradientSync strategies through the interface the step uses: the registries' names and errors,
// bytes per step counted by hand, and the average each strategy leaves on every rank against closed
// forms (run at 1, 2 and 4 ranks).
#include "distributed/gradient_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "distributed/gradient_encoding.h"
#include "distributed/mpi_communicator.h"
#include "mpi_test_env.h"
#include "tests/test_util.h"

namespace dptrain::distributed {
namespace {

// A 16 x 12 weight (PowerSGD compresses it at rank 1: (16 + 12) x 1 x 2 < 192) and a bias of 16.
std::vector<NamedTensor> weight_and_bias() {
  return {{"fc.weight", Tensor::zeros({16, 12}, true)}, {"fc.bias", Tensor::zeros({16}, true)}};
}

void fill_gradients(const FlatParameters& flat, float value) {
  std::fill_n(flat.grads().data_ptr(), flat.size(), value);
}

TEST(GradientSyncRegistry, UnknownNamesListTheRegisteredOnes) {
  EXPECT_EQ(gradient_sync_names(), (std::vector<std::string>{"allreduce", "powersgd", "exact_sum", "local"}));
  EXPECT_EQ(gradient_encoding_names(), (std::vector<std::string>{"none", "fp16", "bf16", "fp64"}));
  EXPECT_EQ(compression_names(), (std::vector<std::string>{"none", "fp16", "bf16", "fp64", "powersgd"}));
  MpiCommunicator comm(test::world());
  FlatParameters flat(weight_and_bias(), Device::cpu());
  test_util::expect_error(
      [&] {
        make_gradient_sync("zero1", {comm, comm, flat, {}});
      },
      {"\"zero1\"", "\"allreduce\", \"powersgd\", \"exact_sum\" or \"local\""});
  test_util::expect_error([&] { gradient_encoding("fp8"); },
                          {"\"fp8\"", "\"none\", \"fp16\", \"bf16\" or \"fp64\""});
  EXPECT_EQ(gradient_sync_state_names(), (std::vector<std::string>{"powersgd.q", "powersgd.error"}));
}

TEST(GradientSync, PayloadBytesCountedByHand) {
  MpiCommunicator comm(test::world());
  FlatParameters flat(weight_and_bias(), Device::cpu());
  const int64_t elements = flat.size();  // 192 + 16, padding included
  ASSERT_GE(elements, 208);
  const auto bytes = [&](const std::string& name, GradientSyncOptions options, int64_t step) {
    return make_gradient_sync(name, {comm, comm, flat, options})->payload_bytes(step);
  };
  EXPECT_EQ(bytes("allreduce", {}, 0), 4 * elements);
  EXPECT_EQ(bytes("allreduce", {.encoding = "fp16"}, 0), 2 * elements);
  EXPECT_EQ(bytes("allreduce", {.encoding = "bf16"}, 0), 2 * elements);
  EXPECT_EQ(bytes("allreduce", {.encoding = "fp64"}, 0), 8 * elements);
  EXPECT_EQ(bytes("local", {}, 0), 0);
  EXPECT_EQ(bytes("exact_sum", {}, 0), 8 * elements);
  // PowerSGD at rank 1 from step 5: plain floats before; then P (16 x 1), Q (12 x 1) and the bias.
  const GradientSyncOptions powersgd{.powersgd = {.rank = 1, .start_step = 5}};
  EXPECT_EQ(bytes("powersgd", powersgd, 4), 4 * elements);
  EXPECT_EQ(bytes("powersgd", powersgd, 5), 4 * (16 + 12 + 16));
}

// Rank r's micro-batch i leaves gradient (r + 1) (i + 1) x its loss scale everywhere, as a backward
// seeded with that scale would for a loss of (r + 1) (i + 1) x sum(parameters).
float run_step(GradientSync& sync, const FlatParameters& flat, int64_t micro_batches, float loss_scale) {
  const int r = test::rank(), n = test::size();
  sync.begin_step({.step = 0, .micro_batches = micro_batches, .global_micro_batches = micro_batches * n});
  fill_gradients(flat, 0.0f);
  for (int64_t i = 0; i < micro_batches; ++i) {
    sync.before_backward(i);
    float* g = flat.grads().data_ptr();
    for (int64_t e = 0; e < flat.size(); ++e) g[e] += static_cast<float>((r + 1) * (i + 1)) * loss_scale;
    sync.after_backward(i);
  }
  sync.finish_step();
  return flat.grads().data_ptr()[0];
}

TEST(GradientSync, EveryStrategyLeavesTheAverageOnEveryRank) {
  MpiCommunicator comm(test::world());
  FlatParameters flat(weight_and_bias(), Device::cpu());
  const int n = test::size();
  // The average over ranks and micro-batches of (r + 1)(i + 1): (n + 1) / 2 x (passes + 1) / 2.
  const auto average = [&](int64_t passes) { return (n + 1) / 2.0 * (passes + 1) / 2.0; };
  for (const std::string name : {"allreduce", "exact_sum"}) {
    for (int64_t passes : {1, 3}) {
      auto sync = make_gradient_sync(name, {comm, comm, flat, {.fusion_threshold_mb = 0.0001}});
      const float scale = 1.0f / static_cast<float>(passes * n);
      EXPECT_NEAR(run_step(*sync, flat, passes, scale), average(passes), 1e-5)
          << name << " passes " << passes;
      EXPECT_TRUE(test::all_ranks(flat.grads().data_ptr()[flat.size() - 1] == flat.grads().data_ptr()[0]));
    }
  }
  // Before its start step PowerSGD is the plain allreduce.
  auto powersgd =
      make_gradient_sync("powersgd", {comm, comm, flat, {.powersgd = {.rank = 1, .start_step = 1}}});
  EXPECT_NEAR(run_step(*powersgd, flat, 2, 1.0f / static_cast<float>(2 * n)), average(2), 1e-5);
}

// "local" averages nothing: each rank keeps its own gradients, seeded with 1 / passes.
TEST(GradientSync, LocalKeepsEachRanksOwnGradients) {
  MpiCommunicator comm(test::world());
  FlatParameters flat(weight_and_bias(), Device::cpu());
  auto sync = make_gradient_sync("local", {comm, comm, flat, {}});
  ASSERT_EQ(sync->ranks_in_average(), 1);
  EXPECT_EQ(make_gradient_sync("allreduce", {comm, comm, flat, {}})->ranks_in_average(), test::size());
  // Two passes of (r + 1)(i + 1) / 2: the mean over i of (r + 1)(i + 1) is 1.5 (r + 1).
  EXPECT_EQ(run_step(*sync, flat, 2, 0.5f), 1.5f * static_cast<float>(test::rank() + 1));
}

// The fp64 sum of one element's terms is exact here, so its rounding to fp32 is the correctly rounded
// sum, whatever order MPI adds in: 1 on rank 0 and 2^-24 on every other rank.
TEST(GradientSync, Fp64EncodingGivesTheCorrectlyRoundedSum) {
  MpiCommunicator comm(test::world());
  FlatParameters flat(weight_and_bias(), Device::cpu());
  auto sync = make_gradient_sync("allreduce",
                                 {comm, comm, flat, {.encoding = "fp64", .fusion_threshold_mb = 0.0001}});
  const double tiny = std::ldexp(1.0, -24);
  sync->begin_step({.step = 0, .micro_batches = 1, .global_micro_batches = test::size()});
  fill_gradients(flat, test::rank() == 0 ? 1.0f : static_cast<float>(tiny));
  sync->before_backward(0);
  sync->after_backward(0);
  sync->finish_step();
  const float expected = static_cast<float>(1.0 + (test::size() - 1) * tiny);
  for (int64_t e = 0; e < flat.size(); ++e) ASSERT_EQ(flat.grads().data_ptr()[e], expected) << e;
}

}  // namespace
}  // namespace dptrain::distributed
