// PowerSgdReducer: PyTorch's DDP powerSGD_hook on fixed gradients (tests/fixtures/powersgd.safetensors,
// 2 ranks), exact recovery of an average of rank <= r, conservation of the gradient through error
// feedback, which tensors are compressed, and Gram-Schmidt against closed forms.
#include "distributed/powersgd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/safetensors.h"
#include "distributed/mpi_communicator.h"
#include "mpi_test_env.h"

namespace dptrain::distributed {
namespace {

// The fixture's parameters, in registration order (make_powersgd_fixture.py).
const std::vector<std::pair<std::string, Shape>> kShapes = {{"conv.weight", {8, 4, 3, 3}},
                                                            {"conv.bias", {8}},
                                                            {"fc.weight", {16, 12}},
                                                            {"fc.bias", {16}},
                                                            {"small.weight", {4, 3}}};

std::vector<NamedTensor> zero_parameters() {
  std::vector<NamedTensor> p;
  for (const auto& [name, shape] : kShapes) p.push_back({name, Tensor::zeros(shape, true)});
  return p;
}

float* gradient(const FlatParameters& flat, std::size_t k) {
  return flat.grads().data_ptr() + flat.offset(k);
}

TEST(PowerSgd, OrthogonalizeGivesOrthonormalColumnsSpanningTheSameSpace) {
  // Columns (3, 4, 0) and (1, 1, 1): Gram-Schmidt gives (0.6, 0.8, 0) and the rest of (1, 1, 1)
  // normalised: (1, 1, 1) - 1.4 (0.6, 0.8, 0) = (0.16, -0.12, 1), norm sqrt(1.04).
  std::vector<float> a = {3, 1, 4, 1, 0, 1};  // 3 x 2, row-major
  orthogonalize_columns(a.data(), 3, 2);
  const double n = std::sqrt(1.04);
  const std::vector<double> expected = {0.6, 0.16 / n, 0.8, -0.12 / n, 0, 1 / n};
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], expected[i], 1e-6) << i;
  // A zero column stays zero instead of becoming NaN.
  EXPECT_TRUE(orthogonalize_columns(a.data(), 3, 2));
  std::vector<float> z = {0, 1, 0, 2};  // 2 x 2
  EXPECT_FALSE(orthogonalize_columns(z.data(), 2, 2));
  EXPECT_EQ(z[0], 0.0f);
  EXPECT_EQ(z[2], 0.0f);
  EXPECT_NEAR(z[1], 1 / std::sqrt(5.0), 1e-7);
}

TEST(PowerSgd, CompressesWhatPyTorchWouldAndCountsThePayload) {
  test::SelfCommunicator self;
  FlatParameters flat(zero_parameters(), Device::cpu());
  for (int64_t rank : {1, 2, 4}) {
    PowerSgdReducer reducer(self, flat, {.rank = rank});
    // conv.weight (8 x 36) and fc.weight (16 x 12) compress while (n + m) r x 2 < n m: at ranks 1
    // and 2, not at 4 (352 > 288, 224 > 192). small.weight (4 x 3) and the biases never do.
    std::vector<std::string> compressed;
    int64_t p = 0, q = 0;
    for (const PowerSgdMatrix& m : reducer.matrices()) {
      compressed.push_back(kShapes[m.parameter].first);
      p += m.rows * m.rank;
      q += m.cols * m.rank;
    }
    const std::vector<std::string> expected =
        rank == 4 ? std::vector<std::string>{} : std::vector<std::string>{"conv.weight", "fc.weight"};
    EXPECT_EQ(compressed, expected) << "rank " << rank;
    const int64_t uncompressed = 8 + 16 + 12 + (rank == 4 ? 288 + 192 : 0);
    EXPECT_EQ(reducer.payload_elements(), uncompressed + p + q) << "rank " << rank;
  }
}

// The hook's semantics, step by step: two plain steps (the caller's allreduce, here summed by hand
// since every rank's gradient is in the fixture), then four compressed ones with error feedback and
// warm start from PyTorch's own initial Q.
TEST(PowerSgd, MatchesPyTorchPowerSgdHookOnFixedGradients) {
  if (test::size() != 2)
    GTEST_SKIP() << "the fixture was made by PyTorch's hook on 2 ranks; this run has " << test::size();
  const safetensors::File fixture =
      safetensors::load(std::string(DPTRAIN_SOURCE_DIR) + "/tests/fixtures/powersgd.safetensors");
  const auto stored = [&](const std::string& name) -> const Tensor& {
    const Tensor* t = fixture.find(name);
    if (t == nullptr) throw std::runtime_error("powersgd.safetensors has no " + name);
    return *t;
  };
  MpiCommunicator comm(test::world());
  for (int64_t rank : {1, 2}) {
    const std::string prefix = "r" + std::to_string(rank) + ".";
    FlatParameters flat(zero_parameters(), Device::cpu());
    PowerSgdReducer reducer(comm, flat, {.rank = rank, .start_step = 2});
    for (const PowerSgdMatrix& m : reducer.matrices()) {
      const Tensor& q0 = stored(prefix + kShapes[m.parameter].first + ".q0");
      ASSERT_EQ(q0.numel(), m.cols * m.rank);
      std::copy_n(q0.data_ptr(), q0.numel(), reducer.q().data_ptr() + m.q_offset);
    }
    double worst = 0;
    for (int step = 0; step < 6; ++step) {
      const std::string at = ".step" + std::to_string(step);
      flat.zero_grad();
      for (std::size_t k = 0; k < kShapes.size(); ++k) {
        const std::string name = prefix + kShapes[k].first;
        const Tensor& mine = stored(name + ".grad.rank" + std::to_string(test::rank()) + at);
        const Tensor& other = stored(name + ".grad.rank" + std::to_string(1 - test::rank()) + at);
        for (int64_t i = 0; i < mine.numel(); ++i) {
          // As the trainer seeds backward: each rank's gradient divided by the world size.
          gradient(flat, k)[i] = mine.data_ptr()[i] / 2;
          if (!reducer.compresses(step)) gradient(flat, k)[i] += other.data_ptr()[i] / 2;
        }
      }
      if (reducer.compresses(step)) reducer.reduce(step);
      for (std::size_t k = 0; k < kShapes.size(); ++k) {
        const Tensor& expected = stored(prefix + kShapes[k].first + ".avg" + at);
        float largest = 0;
        for (float v : expected.values()) largest = std::max(largest, std::fabs(v));
        for (int64_t i = 0; i < expected.numel(); ++i) {
          const double error = std::fabs(gradient(flat, k)[i] - expected.data_ptr()[i]) / largest;
          worst = std::max(worst, error);
          EXPECT_LE(error, 1e-5) << prefix << kShapes[k].first << at << "[" << i << "]";
        }
      }
    }
    if (test::rank() == 0)
      std::printf("  PowerSGD rank %lld vs PyTorch's hook: worst %.3g of max|g|\n",
                  static_cast<long long>(rank), worst);
  }
}

// If the average of the ranks' gradients has rank <= r, PowerSGD recovers it exactly (up to
// rounding), from any Q (even after a step that left it zero), on any number of ranks: M q spans
// the column space, and Q = M^T P completes it.
TEST(PowerSgd, RecoversAnAverageOfRankAtMostR) {
  MpiCommunicator comm(test::world());
  FlatParameters flat(zero_parameters(), Device::cpu());
  PowerSgdReducer reducer(comm, flat, {.rank = 2, .start_step = 0, .seed = 3});
  // fc.weight (16 x 12): rank r's gradient is u1 v1^T + (r + 1) u2 v2^T, divided by N.
  Rng rng(11);
  std::vector<float> u1(16), u2(16), v1(12), v2(12);
  for (auto* v : {&u1, &u2, &v1, &v2})
    for (float& x : *v) x = static_cast<float>(rng.normal());
  const double n = test::size();
  // First a step whose gradients are all zero: Q becomes zero and must be drawn anew, or every later
  // approximation would be zero too.
  flat.zero_grad();
  reducer.reduce(0);
  flat.zero_grad();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 12; ++j)
      gradient(flat, 2)[i * 12 + j] =
          static_cast<float>((u1[i] * v1[j] + (test::rank() + 1) * u2[i] * v2[j]) / n);
  reducer.reduce(1);
  const double mean_factor = (n + 1) / 2;  // the mean of r + 1 over the ranks
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 12; ++j) {
      const double expected = u1[i] * v1[j] + mean_factor * u2[i] * v2[j];
      EXPECT_NEAR(gradient(flat, 2)[i * 12 + j], expected, 1e-5 * (1 + std::fabs(expected))) << i << "," << j;
    }
}

// Error feedback loses nothing: over K steps, the averaged gradients applied plus the errors left
// on all ranks add up to the sum of every rank's gradients (each divided by N).
TEST(PowerSgd, ErrorFeedbackConservesTheGradient) {
  MpiCommunicator comm(test::world());
  FlatParameters flat(zero_parameters(), Device::cpu());
  PowerSgdReducer reducer(comm, flat, {.rank = 1, .start_step = 0, .seed = 5});
  const std::size_t conv = 0, size = 8 * 36;
  const double n = test::size();
  std::vector<double> sent(size, 0), given(size, 0);  // given: all ranks' gradients, summed below
  for (int step = 0; step < 5; ++step) {
    flat.zero_grad();
    Rng rng(1000 * static_cast<uint64_t>(step) + static_cast<uint64_t>(test::rank()));
    for (std::size_t i = 0; i < size; ++i) {
      gradient(flat, conv)[i] = static_cast<float>(rng.normal() / n);
      given[i] += gradient(flat, conv)[i];
    }
    reducer.reduce(step);
    for (std::size_t i = 0; i < size; ++i) sent[i] += gradient(flat, conv)[i];
  }
  std::vector<double> totals(2 * size);
  for (std::size_t i = 0; i < size; ++i) {
    totals[i] = given[i];
    totals[size + i] = reducer.error().data_ptr()[flat.offset(conv) + i];
  }
  comm.allreduce(std::span<double>(totals), ReduceOp::kSum, "test sums");
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < size; ++i) {
    worst = std::max(worst, std::fabs(sent[i] + totals[size + i] - totals[i]));
    largest = std::max(largest, std::fabs(totals[i]));
  }
  EXPECT_LE(worst, 1e-5 * largest) << "applied + errors left differ from the gradients given";
}

}  // namespace
}  // namespace dptrain::distributed
