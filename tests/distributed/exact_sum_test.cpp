// ExactGradientSum and ExactScalarSum: the same bits for any split of the micro-batches into ranks
// and any order (the MPI sum against this process alone adding every micro-batch), agreement with a
// long-double reference within the bound of exact_sum.h, no overflow at the largest magnitudes, zero
// tensors, and a non-finite gradient stopping every rank alike.
#include "distributed/exact_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "distributed/mpi_communicator.h"
#include "mpi_test_env.h"
#include "tests/test_util.h"

namespace dptrain::distributed {
namespace {

// Tensor sizes with padding between them in the flat layout (not multiples of 16).
const std::vector<int64_t> kTensorSizes = {37, 1, 300, 16, 5};

// micro[i][t]: micro-batch i's gradient of tensor t, the same on every rank. Magnitudes span 2^-40
// to 2^40 within a tensor and signs mix, so that float sums depend on their order.
using Gradients = std::vector<std::vector<std::vector<float>>>;
Gradients make_gradients(int64_t micro_batches, uint64_t seed) {
  Rng rng(seed);
  Gradients g(static_cast<std::size_t>(micro_batches));
  for (auto& micro : g)
    for (int64_t n : kTensorSizes) {
      std::vector<float> values(static_cast<std::size_t>(n));
      for (float& v : values) {
        const double mantissa = rng.uniform() * 2 - 1;
        v = static_cast<float>(std::ldexp(mantissa, static_cast<int>(rng.below(81)) - 40));
      }
      micro.push_back(std::move(values));
    }
  return g;
}

// Sums micro-batches [begin, end) of `g` on this rank through ExactGradientSum over `comm`.
std::vector<std::vector<float>> exact_sum(Communicator& comm, const Gradients& g, int64_t begin, int64_t end,
                                          bool reversed = false) {
  FlatParameters flat(test_util::zero_parameters(kTensorSizes), Device::cpu());
  ExactGradientSum sum(comm, flat);
  sum.begin(7, static_cast<int64_t>(g.size()), end - begin);
  for (int64_t k = 0; k < end - begin; ++k) {
    const int64_t i = reversed ? end - 1 - k : begin + k;
    flat.zero_grad();
    for (std::size_t t = 0; t < kTensorSizes.size(); ++t)
      std::copy(g[i][t].begin(), g[i][t].end(), flat.grads().data_ptr() + flat.offset(t));
    sum.add_micro_batch();
  }
  sum.finish();
  std::vector<std::vector<float>> out;
  for (std::size_t t = 0; t < kTensorSizes.size(); ++t) {
    const float* at = flat.grads().data_ptr() + flat.offset(t);
    out.emplace_back(at, at + kTensorSizes[t]);
  }
  return out;
}

// This rank's contiguous share of m micro-batches, as the sampler hands them out.
std::pair<int64_t, int64_t> share(int64_t m) {
  return {m * test::rank() / test::size(), m * (test::rank() + 1) / test::size()};
}

TEST(ExactGradientSum, SameBitsForAnySplitIntoRanksAndAnyOrder) {
  for (int64_t micro_batches : {1, 3, 8, 13}) {
    const Gradients g = make_gradients(micro_batches, 100 + micro_batches);
    test::SelfCommunicator self;
    const auto alone = exact_sum(self, g, 0, micro_batches);
    const auto alone_reversed = exact_sum(self, g, 0, micro_batches, /*reversed=*/true);
    MpiCommunicator comm(test::world());
    const auto [begin, end] = share(micro_batches);
    const auto shared = exact_sum(comm, g, begin, end);
    for (std::size_t t = 0; t < kTensorSizes.size(); ++t) {
      EXPECT_TRUE(test::bitwise_equal(alone[t], alone_reversed[t]))
          << "order, M " << micro_batches << " p" << t;
      EXPECT_TRUE(test::bitwise_equal(alone[t], shared[t]))
          << test::size() << " ranks vs one, M " << micro_batches << " p" << t;
    }
  }
}

// |result - exact| <= M x 2^(E - 52 + c) from the fixed point + half an fp32 ulp (exact_sum.h).
TEST(ExactGradientSum, WithinTheStatedBoundOfTheExactSum) {
  const int64_t m = 9;  // c = ceil(log2 9) = 4
  const Gradients g = make_gradients(m, 7);
  MpiCommunicator comm(test::world());
  const auto [begin, end] = share(m);
  const auto result = exact_sum(comm, g, begin, end);
  for (std::size_t t = 0; t < kTensorSizes.size(); ++t) {
    float largest = 0;
    for (const auto& micro : g)
      for (float v : micro[t]) largest = std::max(largest, std::fabs(v));
    int e = 0;
    std::frexp(largest, &e);
    const long double fixed_point_error = m * std::ldexp(1.0L, e - 52 + 4);
    for (int64_t k = 0; k < kTensorSizes[t]; ++k) {
      // The reference's own error, about M x 2^(e - 64), is 2^-12 of the fixed point's bound.
      long double exact = 0;
      for (const auto& micro : g) exact += micro[t][k];
      const long double ulp = std::ldexp(1.0L, std::max(std::ilogb(static_cast<float>(exact)), -126) - 23);
      EXPECT_LE(std::fabs(result[t][k] - exact), ulp / 2 + fixed_point_error) << "p" << t << "[" << k << "]";
    }
  }
}

TEST(ExactGradientSum, LargestMagnitudesDoNotOverflow) {
  // 16 micro-batches of 2^122 x (1 - 2^-24), the largest 16 x value that fp32 still holds.
  const int64_t m = 16;
  const float big = std::ldexp(1.0f - std::ldexp(1.0f, -24), 122);
  Gradients g = make_gradients(m, 3);
  for (auto& micro : g)
    for (auto& tensor : micro) std::fill(tensor.begin(), tensor.end(), big);
  g[5][2][0] = -big;  // one element: 14 x big
  MpiCommunicator comm(test::world());
  const auto [begin, end] = share(m);
  const auto result = exact_sum(comm, g, begin, end);
  EXPECT_EQ(result[0][0], 16 * big);
  EXPECT_EQ(result[2][0], 14 * big);
  EXPECT_EQ(result[4][4], 16 * big);
}

TEST(ExactGradientSum, ZeroTensorsStayZeroAndSubnormalsCount) {
  const int64_t m = 4;
  Gradients g = make_gradients(m, 5);
  for (auto& micro : g) {
    std::fill(micro[1].begin(), micro[1].end(), 0.0f);
    std::fill(micro[3].begin(), micro[3].end(), std::numeric_limits<float>::denorm_min());
  }
  MpiCommunicator comm(test::world());
  const auto [begin, end] = share(m);
  const auto result = exact_sum(comm, g, begin, end);
  EXPECT_EQ(result[1][0], 0.0f);
  EXPECT_EQ(result[3][7], 4 * std::numeric_limits<float>::denorm_min());
}

TEST(ExactGradientSum, NonFiniteGradientStopsEveryRankNamingTheTensor) {
  const int64_t m = 2 * test::size();
  Gradients g = make_gradients(m, 9);
  g[static_cast<std::size_t>(m - 1)][2][10] = std::numeric_limits<float>::quiet_NaN();  // the last rank's
  MpiCommunicator comm(test::world());
  const auto [begin, end] = share(m);
  try {
    exact_sum(comm, g, begin, end);
    ADD_FAILURE() << "no error on rank " << test::rank();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite gradient in p2 at step 7"), std::string::npos)
        << e.what();
  }
}

TEST(ExactScalarSum, OrderFreeAndNaNOnInvalidTerms) {
  Rng rng(11);
  std::vector<double> terms(1000);
  for (double& t : terms) t = std::ldexp(rng.uniform() * 2 - 1, static_cast<int>(rng.below(40)) - 10);
  ExactScalarSum forward, backward;
  for (double t : terms) forward.add(t);
  for (auto it = terms.rbegin(); it != terms.rend(); ++it) backward.add(*it);
  EXPECT_EQ(forward.value(), backward.value());
  long double exact = 0;
  for (double t : terms) exact += t;
  EXPECT_NEAR(forward.value(), static_cast<double>(exact), 1000 * std::ldexp(1.0, -33));

  // Across ranks: each rank adds a contiguous part; the total equals this process's own.
  MpiCommunicator comm(test::world());
  const auto [begin, end] = share(static_cast<int64_t>(terms.size()));
  ExactScalarSum mine;
  for (int64_t i = begin; i < end; ++i) mine.add(terms[static_cast<std::size_t>(i)]);
  mine.allreduce(comm, "test sum");
  EXPECT_EQ(mine.value(), forward.value());

  // Past 2^63 units, where one int64 of them wrapped: 8 terms of 2^61 a rank, exact on any number.
  ExactScalarSum large;
  for (int i = 0; i < 8; ++i) large.add(0x1p61);
  large.allreduce(comm, "test sum of large terms");
  EXPECT_EQ(large.value(), 0x1p64 * comm.size());
  // Negative terms split exactly (-2.5 = -3 + 0.5) and cancel large ones whatever the order.
  ExactScalarSum mixed, reversed;
  const std::vector<double> signed_terms = {-2.5, 0x1p61, 0x1p61, -0x1p61, 1.25, -0x1p61, 0x1p-20};
  for (double t : signed_terms) mixed.add(t);
  for (auto it = signed_terms.rbegin(); it != signed_terms.rend(); ++it) reversed.add(*it);
  EXPECT_EQ(mixed.value(), -1.25 + 0x1p-20);
  EXPECT_EQ(reversed.value(), mixed.value());

  ExactScalarSum invalid;
  invalid.add(1.0);
  invalid.add(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(invalid.value()));
}

}  // namespace
}  // namespace dptrain::distributed
