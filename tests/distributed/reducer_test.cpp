// GradientReducer: the static bucket layout, averaging against a closed form, bitwise agreement
// between fusion/overlap settings, fp16/bf16 compression error bounds, overflow protection,
// non-finite gradients, and passes that accumulate without arming the hooks.
//
// Gradients come through the tape, so the grad-ready hooks fire during backward exactly as in
// training: a linear chain z = ((x W1^T + b1) W2^T + b2) W3^T + b3, loss = sum(z), with a batch x
// that differs per rank. Its gradients have a closed form the test evaluates in double for every
// rank (reference()), independently of the ops, the tape and MPI.
#include "distributed/reducer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "mpi_test_env.h"
#include "tests/test_util.h"

namespace dptrain::distributed {
namespace {

// ---------------------------------------------------------------------------------------------
// Bucket layout
//
// Gradients live inside the bucket buffer, each starting on a 64-byte (16-float) boundary, and a
// bucket's numel counts that padding. The worked examples use sizes that are multiples of 16, so
// no padding arises and the expected layouts follow from the documented rule alone.

int64_t floats_in(double mb) {
  return static_cast<int64_t>(mb * 1024 * 1024 / 4);
}

// Holds for any sizes: buckets cover the parameters in reverse registration order, in increasing
// non-overlapping ranges of the flat buffer that hold at least their tensors; threshold 0 means one
// bucket per tensor.
void check_layout_basics(const std::vector<int64_t>& sizes, const ReducerOptions& o,
                         const std::vector<Bucket>& buckets) {
  std::vector<std::size_t> order;
  int64_t end = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bucket = buckets[b];
    ASSERT_FALSE(bucket.parameters.empty()) << "bucket " << b;
    EXPECT_GE(bucket.offset, end) << "bucket " << b << " overlaps the one before";
    int64_t numel = 0;
    for (std::size_t k : bucket.parameters) {
      order.push_back(k);
      numel += sizes[k];
    }
    EXPECT_GE(bucket.numel, numel) << "bucket " << b;
    end = bucket.offset + bucket.numel;
    if (o.fusion_threshold_mb == 0) {
      EXPECT_EQ(bucket.parameters.size(), 1u) << "bucket " << b;
    }
  }
  std::vector<std::size_t> reverse(sizes.size());
  std::iota(reverse.rbegin(), reverse.rend(), std::size_t{0});
  EXPECT_EQ(order, reverse);
}

// The full rule for sizes that need no padding (multiples of 16): contiguous buckets; bucket 0
// holds <= first_bucket_mb (capped by the threshold) and every later bucket <= fusion_threshold_mb,
// unless it is a single tensor larger than that; buckets are filled greedily (the next bucket's
// first tensor would not have fit).
void check_layout_rule(const std::vector<int64_t>& sizes, const ReducerOptions& o,
                       const std::vector<Bucket>& buckets) {
  SCOPED_TRACE("fusion " + std::to_string(o.fusion_threshold_mb) + " MB, first " +
               std::to_string(o.first_bucket_mb) + " MB");
  check_layout_basics(sizes, o, buckets);
  int64_t offset = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bucket = buckets[b];
    int64_t numel = 0;
    for (std::size_t k : bucket.parameters) numel += sizes[k];
    EXPECT_EQ(bucket.offset, offset) << "bucket " << b;
    EXPECT_EQ(bucket.numel, numel) << "bucket " << b;
    offset += numel;
    if (o.fusion_threshold_mb == 0) continue;
    const int64_t cap = b == 0 ? floats_in(std::min(o.first_bucket_mb, o.fusion_threshold_mb))
                               : floats_in(o.fusion_threshold_mb);
    if (bucket.parameters.size() > 1) {
      EXPECT_LE(bucket.numel, cap) << "bucket " << b;
    }
    if (b + 1 < buckets.size()) {
      EXPECT_GT(bucket.numel + sizes[buckets[b + 1].parameters.front()], cap)
          << "bucket " << b << " was not filled greedily";
    }
  }
}

TEST(ReducerBuckets, WorkedExample) {
  // Thresholds in floats: fusion 1/1024 MB = 256, first 1/4096 MB = 64.
  const std::vector<int64_t> sizes = {320, 112, 96, 48, 64, 16};
  MpiCommunicator comm(test::world());
  const ReducerOptions o{1.0 / 1024, 1.0 / 4096, true, "none"};
  test::TestReducer reducer_owner(comm, test_util::zero_parameters(sizes), o);
  GradientReducer& reducer = reducer_owner.reducer;
  // Backward order p5 p4 p3 p2 p1 p0. First bucket, cap 64: {p5} = 16 (+ 64 > 64). Then cap 256:
  // {p4, p3, p2} = 208 (+ 112 > 256), {p1} = 112 (+ 320 > 256), {p0} = 320 (alone, over the cap).
  const auto& b = reducer.buckets();
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].parameters, (std::vector<std::size_t>{5}));
  EXPECT_EQ(b[1].parameters, (std::vector<std::size_t>{4, 3, 2}));
  EXPECT_EQ(b[2].parameters, (std::vector<std::size_t>{1}));
  EXPECT_EQ(b[3].parameters, (std::vector<std::size_t>{0}));
  EXPECT_EQ(b[0].offset, 0);
  EXPECT_EQ(b[1].offset, 16);
  EXPECT_EQ(b[2].offset, 224);
  EXPECT_EQ(b[3].offset, 336);
  EXPECT_EQ(b[1].numel, 208);
  EXPECT_EQ(b[3].numel, 320);
  check_layout_rule(sizes, o, b);
}

TEST(ReducerBuckets, FirstBucketMayHoldSeveralSmallTensors) {
  const std::vector<int64_t> sizes = {208, 16, 16, 16};
  MpiCommunicator comm(test::world());
  const ReducerOptions o{1.0 / 1024, 1.0 / 4096, false, "none"};  // caps 256, 64
  test::TestReducer reducer_owner(comm, test_util::zero_parameters(sizes), o);
  GradientReducer& reducer = reducer_owner.reducer;
  const auto& b = reducer.buckets();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].parameters, (std::vector<std::size_t>{3, 2, 1}));  // 48 <= 64
  EXPECT_EQ(b[1].parameters, (std::vector<std::size_t>{0}));
  check_layout_rule(sizes, o, b);
}

TEST(ReducerBuckets, ThresholdBelowFirstBucketCapsTheFirstBucketToo) {
  const std::vector<int64_t> sizes = {32, 32, 32, 32};
  MpiCommunicator comm(test::world());
  const ReducerOptions o{1.0 / 16384, 1, true, "none"};  // fusion 16 floats < first 1 MB
  test::TestReducer reducer_owner(comm, test_util::zero_parameters(sizes), o);
  GradientReducer& reducer = reducer_owner.reducer;
  ASSERT_EQ(reducer.buckets().size(), 4u);  // every tensor is over the 16-float cap: one each
  check_layout_rule(sizes, o, reducer.buckets());
}

TEST(ReducerBuckets, ThresholdZeroMeansOneBucketPerTensor) {
  const std::vector<int64_t> sizes = {7, 1, 3, 1000, 2};
  MpiCommunicator comm(test::world());
  const ReducerOptions o{0, 1, true, "none"};
  test::TestReducer reducer_owner(comm, test_util::zero_parameters(sizes), o);
  GradientReducer& reducer = reducer_owner.reducer;
  const auto& b = reducer.buckets();
  ASSERT_EQ(b.size(), sizes.size());
  for (std::size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i].parameters, std::vector<std::size_t>{sizes.size() - 1 - i});
  }
  check_layout_basics(sizes, o, b);
}

TEST(ReducerBuckets, HugeThresholdGivesASmallFirstBucketThenOneBucket) {
  const std::vector<int64_t> sizes = {100000, 300000, 200000, 16};  // floats; 1 MB = 262144 floats
  MpiCommunicator comm(test::world());
  const ReducerOptions o{128, 1, true, "none"};
  test::TestReducer reducer_owner(comm, test_util::zero_parameters(sizes), o);
  GradientReducer& reducer = reducer_owner.reducer;
  const auto& b = reducer.buckets();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].parameters, (std::vector<std::size_t>{3, 2}));  // 200016 <= 262144, + 300000 > it
  EXPECT_EQ(b[1].parameters, (std::vector<std::size_t>{1, 0}));
  check_layout_rule(sizes, o, b);
}

TEST(ReducerBuckets, RuleHoldsForManyShapesAndThresholds) {
  MpiCommunicator comm(test::world());
  uint64_t state = 12345;
  const auto next = [&state] {
    return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33;
  };
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int64_t> sizes(1 + next() % 12), odd_sizes(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      sizes[k] = 16 * (1 + static_cast<int64_t>(next() % (next() % 2 ? 40 : 4)));
      odd_sizes[k] = 1 + static_cast<int64_t>(next() % 700);
    }
    for (double fusion : {0.0, 1.0 / 4096, 1.0 / 1024, 1.0 / 256, 64.0})
      for (double first : {0.0, 1.0 / 8192, 1.0 / 1024, 1.0}) {
        const ReducerOptions o{fusion, first, true, "none"};
        test::TestReducer reducer_owner(comm, test_util::zero_parameters(sizes), o);
        GradientReducer& reducer = reducer_owner.reducer;
        check_layout_rule(sizes, o, reducer.buckets());
        test::TestReducer odd_owner(comm, test_util::zero_parameters(odd_sizes), o);
        GradientReducer& odd = odd_owner.reducer;
        check_layout_basics(odd_sizes, o, odd.buckets());
      }
  }
}

// ---------------------------------------------------------------------------------------------
// The three-layer linear chain and its closed-form gradients

constexpr int64_t kBatch = 4, kIn = 48, kH1 = 64, kH2 = 32, kOut = 10;

struct Chain {
  std::vector<NamedTensor> params;  // 0.weight, 0.bias, 1.weight, 1.bias, 2.weight, 2.bias
  Chain() {
    const int64_t dims[4] = {kIn, kH1, kH2, kOut};
    for (int l = 0; l < 3; ++l) {
      std::vector<float> w(dims[l + 1] * dims[l]), b(dims[l + 1]);
      // Same on every rank (as after the start-up broadcast); not exactly representable sums.
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(std::sin(0.37 * i + l));
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * static_cast<float>(std::cos(1.3 * i + l));
      params.push_back({std::to_string(l) + ".weight", Tensor::from_data({dims[l + 1], dims[l]}, w, true)});
      params.push_back({std::to_string(l) + ".bias", Tensor::from_data({dims[l + 1]}, b, true)});
    }
  }
  const Tensor& w(int l) const { return params[2 * l].tensor; }
  const Tensor& b(int l) const { return params[2 * l + 1].tensor; }
  void zero_grad() const {
    for (const NamedTensor& p : params) p.tensor.zero_grad();
  }
  // Seeded as the trainer seeds it (GradientReducer::loss_scale), or with 1 for the local gradient.
  void backward(const std::vector<float>& x, float seed) const {
    Tensor h = Tensor::from_data({kBatch, kIn}, x);
    for (int l = 0; l < 3; ++l) h = ops::linear(h, w(l), b(l));
    ops::sum(h).backward(seed);
  }
};

// Rank r's batch in pass `pass`: scaled by (r + 1) and shifted, so ranks differ.
std::vector<float> batch_of(int r, int pass = 0) {
  std::vector<float> x(kBatch * kIn);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>((r + 1) * std::sin(0.11 * i + 0.7 * pass) + 0.05 * r);
  return x;
}

// d sum(z) / d params in double, in the order of Chain::params.
std::vector<std::vector<double>> reference(const Chain& c, const std::vector<float>& xf) {
  const int64_t dims[4] = {kIn, kH1, kH2, kOut};
  std::vector<std::vector<double>> act(4);
  act[0].assign(xf.begin(), xf.end());
  for (int l = 0; l < 3; ++l) {
    act[l + 1].assign(kBatch * dims[l + 1], 0.0);
    for (int64_t bi = 0; bi < kBatch; ++bi)
      for (int64_t o = 0; o < dims[l + 1]; ++o) {
        double s = c.b(l).data()[o];
        for (int64_t i = 0; i < dims[l]; ++i) s += act[l][bi * dims[l] + i] * c.w(l).data()[o * dims[l] + i];
        act[l + 1][bi * dims[l + 1] + o] = s;
      }
  }
  std::vector<std::vector<double>> grads(6);
  std::vector<double> up(kBatch * kOut, 1.0);  // d loss / d z
  for (int l = 2; l >= 0; --l) {
    std::vector<double>& gw = grads[2 * l];
    std::vector<double>& gb = grads[2 * l + 1];
    gw.assign(dims[l + 1] * dims[l], 0.0);
    gb.assign(dims[l + 1], 0.0);
    std::vector<double> down(kBatch * dims[l], 0.0);
    for (int64_t bi = 0; bi < kBatch; ++bi)
      for (int64_t o = 0; o < dims[l + 1]; ++o) {
        const double g = up[bi * dims[l + 1] + o];
        gb[o] += g;
        for (int64_t i = 0; i < dims[l]; ++i) {
          gw[o * dims[l] + i] += g * act[l][bi * dims[l] + i];
          down[bi * dims[l] + i] += g * c.w(l).data()[o * dims[l] + i];
        }
      }
    up = std::move(down);
  }
  return grads;
}

// The closed-form average over all ranks of the gradients of passes [first, first + passes).
std::vector<std::vector<double>> reference_average(const Chain& c, int n_ranks, int passes = 1,
                                                   int first = 0) {
  std::vector<std::vector<double>> avg;
  for (int r = 0; r < n_ranks; ++r)
    for (int pass = first; pass < first + passes; ++pass) {
      const auto g = reference(c, batch_of(r, pass));
      if (avg.empty()) avg.assign(g.size(), {});
      for (std::size_t k = 0; k < g.size(); ++k) {
        avg[k].resize(g[k].size(), 0.0);
        for (std::size_t i = 0; i < g[k].size(); ++i) avg[k][i] += g[k][i] / n_ranks;
      }
    }
  return avg;
}

// float vs double: the forward/backward kernels round in float, so 1e-5 of each tensor's largest
// reference magnitude (sums of at most 64 products of O(1) terms).
void expect_matches(const Chain& c, const std::vector<std::vector<double>>& ref, const std::string& what) {
  for (std::size_t k = 0; k < c.params.size(); ++k) {
    const Tensor& t = c.params[k].tensor;
    double scale = 0;
    for (double v : ref[k]) scale = std::max(scale, std::abs(v));
    std::size_t bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double err = std::abs(t.grad()[i] - ref[k][i]);
      worst = std::max(worst, err);
      bad += !(err <= 1e-5 * scale);
    }
    EXPECT_EQ(bad, 0u) << what << ": " << c.params[k].name << " worst |err| " << worst << " vs scale "
                       << scale;
  }
}

std::vector<float> all_grads(const Chain& c) {
  std::vector<float> out;
  for (const NamedTensor& p : c.params) out.insert(out.end(), p.tensor.grad().begin(), p.tensor.grad().end());
  return out;
}

struct Setting {
  double fusion_mb, first_mb;
  bool overlap;
};
// Chain sizes in floats: 3072, 64, 2048, 32, 320, 10. 0.004 MB = 1048 floats, 0.01 MB = 2621.
const std::vector<Setting> kSettings = {{0, 1, true},          {0, 1, false},   {0.004, 0.001, true},
                                        {0.004, 0.001, false}, {0.01, 1, true}, {1, 1, true},
                                        {128, 1, false},       {128, 1, true}};

TEST(GradientReducer, AverageMatchesClosedFormForEveryFusionAndOverlapSetting) {
  autograd::clear_tape();
  const int N = test::size();
  std::vector<std::vector<float>> results;
  for (const Setting& s : kSettings) {
    Chain c;
    MpiCommunicator comm(test::world());
    test::TestReducer reducer_owner(comm, c.params,
                                    ReducerOptions{s.fusion_mb, s.first_mb, s.overlap, "none"});
    GradientReducer& reducer = reducer_owner.reducer;
    const std::string what = "fusion " + std::to_string(s.fusion_mb) + " MB, first " +
                             std::to_string(s.first_mb) + " MB, overlap " + (s.overlap ? "on" : "off") +
                             ", " + std::to_string(reducer.buckets().size()) + " bucket(s)";
    // Two steps through the same reducer: the second must not see anything of the first.
    for (int step = 0; step < 2; ++step) {
      c.zero_grad();
      reducer.prepare(step);
      c.backward(batch_of(test::rank(), step), reducer.loss_scale(1));
      reducer.finish();
    }
    // Step 2 used pass index 1 of each rank's batches.
    const auto ref = reference_average(c, N, /*passes=*/1, /*first=*/1);
    expect_matches(c, ref, what);
    results.push_back(all_grads(c));
  }
  // Every setting sums the same per-rank values. With two ranks a + b does not depend on how the
  // buffer is cut into buckets, so the results are bitwise identical; with more ranks MPI may pick
  // a different reduction order per message size, so only the closed-form bound above applies.
  if (N <= 2) {
    for (std::size_t s = 1; s < results.size(); ++s) {
      EXPECT_TRUE(test::bitwise_equal(results[s], results[0]))
          << "setting " << s << " differs bitwise from setting 0";
    }
  }
  // Every rank ends with the same averaged gradients, bit for bit.
  EXPECT_TRUE(test::bitwise_equal(test::root_copy(results[0]), results[0]));
}

// backward_passes_per_step: the first pass runs with the hooks disarmed (no prepare()), so nothing
// may launch while gradients are still accumulating; prepare() then arms the last pass. The result
// is the average over ranks of the sum of both passes.
TEST(GradientReducer, UnarmedPassLaunchesNothingAndFinishReducesTheAccumulatedSum) {
  autograd::clear_tape();
  for (bool overlap : {true, false}) {
    Chain c;
    MpiCommunicator comm(test::world());
    test::TestReducer reducer_owner(comm, c.params, ReducerOptions{0, 1, overlap, "none"});
    GradientReducer& reducer = reducer_owner.reducer;
    for (int step = 0; step < 2; ++step) {
      c.zero_grad();
      // Each pass seeded for one pass: the result is the sum of both passes' averages over ranks.
      c.backward(batch_of(test::rank(), 0), reducer.loss_scale(1));  // accumulation pass: reducer disarmed
      reducer.prepare(step);
      c.backward(batch_of(test::rank(), 1), reducer.loss_scale(1));
      reducer.finish();
    }
    expect_matches(c, reference_average(c, test::size(), 2),
                   std::string("overlap ") + (overlap ? "on" : "off"));
  }
}

// backward_passes_per_step = 3 on every world size: each pass seeded with loss_scale(3), so the
// reduced gradient is the mean over all passes of all ranks, 1 / (3 N) times the sum (the closed
// form), and the seed is exactly that factor.
TEST(GradientReducer, SeveralPassesAverageOverPassesAndRanks) {
  autograd::clear_tape();
  constexpr int kPasses = 3;
  const int N = test::size();
  Chain c;
  MpiCommunicator comm(test::world());
  test::TestReducer reducer_owner(comm, c.params, ReducerOptions{0, 1, true, "none"});
  GradientReducer& reducer = reducer_owner.reducer;
  EXPECT_EQ(reducer.loss_scale(kPasses), 1.0f / static_cast<float>(kPasses * N));
  c.zero_grad();
  for (int pass = 0; pass < kPasses; ++pass) {
    if (pass == kPasses - 1) reducer.prepare(0);  // the last pass launches the reduction
    c.backward(batch_of(test::rank(), pass), reducer.loss_scale(kPasses));
  }
  reducer.finish();
  auto mean = reference_average(c, N, kPasses);
  for (auto& tensor : mean)
    for (double& v : tensor) v /= kPasses;
  expect_matches(c, mean, std::to_string(kPasses) + " passes on " + std::to_string(N) + " rank(s)");
}

// A step where prepare() is never called (every pass disarmed): finish() alone must launch and
// reduce every bucket, also after earlier prepared steps through the same reducer.
TEST(GradientReducer, FinishWithoutPrepareReducesEverything) {
  autograd::clear_tape();
  for (bool overlap : {true, false}) {
    Chain c;
    MpiCommunicator comm(test::world());
    test::TestReducer reducer_owner(comm, c.params, ReducerOptions{0.004, 0.001, overlap, "none"});
    GradientReducer& reducer = reducer_owner.reducer;
    // A normal step first.
    c.zero_grad();
    reducer.prepare(0);
    c.backward(batch_of(test::rank(), 0), reducer.loss_scale(1));
    reducer.finish();
    // Then a step with no prepare().
    c.zero_grad();
    c.backward(batch_of(test::rank(), 1), reducer.loss_scale(1));
    reducer.finish();
    const auto ref = reference_average(c, test::size(), /*passes=*/1, /*first=*/1);
    expect_matches(c, ref, std::string("second step without prepare(), overlap ") + (overlap ? "on" : "off"));
  }
}

// ---------------------------------------------------------------------------------------------
// Compression

// Error bound for the compressed average (g_i = rank i's fp32 gradient, N ranks, h = fp16 or bf16
// with unit roundoff u: 2^-11 for fp16, 2^-8 for bf16):
//   each rank sends fl_h(g_i / N)      (backward seeded with 1/N, exact in float for N = 1, 2, 4, so
//                                       the fp32 gradient is g_i / N exactly; the cast to half
//                                       rounds once: relative error <= u, or absolute <= 2^-25 in
//                                       fp16's subnormal range below 2^-14),
//   MPI adds the N halves in some order with N - 1 roundings to half, each relative <= u of a
//   partial sum whose magnitude is <= sum_i |g_i| / N (1 + u)^k = mean|g| (1 + O(Nu)),
//   and the result is cast back to fp32 exactly. Hence
//     |avg_compressed - mean(g)| <= u mean|g| + (N - 1) u mean|g| (1 + O(Nu)) + (2N - 1) 2^-25
//                               <= (N + 1) u mean|g| + N 2^-24,
//   where mean|g| = (1/N) sum_i |g_i| per element. Without the division by N the result would be
//   N mean(g), off by (N - 1) |mean(g)|, which is far outside this bound wherever the ranks'
//   gradients do not cancel (checked below: the bound is tight enough to catch it).
double unit_roundoff(const std::string& c) {
  return c == "fp16" ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

TEST(GradientReducer, CompressedAverageStaysWithinTheRoundingBound) {
  autograd::clear_tape();
  const int N = test::size();
  for (const std::string compression : {"fp16", "bf16"})
    for (const Setting& s : {Setting{0, 1, true}, Setting{128, 1, false}, Setting{0.004, 0.001, true}}) {
      Chain c, shadow;  // same initial values; `shadow` has no reducer and keeps its local gradients
      MpiCommunicator comm(test::world());
      test::TestReducer reducer_owner(comm, c.params,
                                      ReducerOptions{s.fusion_mb, s.first_mb, s.overlap, compression});
      GradientReducer& reducer = reducer_owner.reducer;
      c.zero_grad();
      reducer.prepare(3);
      c.backward(batch_of(test::rank(), 0), reducer.loss_scale(1));
      reducer.finish();
      const std::vector<float> got = all_grads(c);
      // Every rank's local fp32 gradients (gathered only now: no MPI call may race the reducer's).
      shadow.zero_grad();
      shadow.backward(batch_of(test::rank(), 0), 1.0f);
      const std::vector<float> local = all_grads(shadow);
      const std::vector<float> every = test::gather_all(local);
      const double u = unit_roundoff(compression);
      std::size_t bad = 0, catches_skipped_division = 0, non_cancelling = 0;
      double worst_ratio = 0;
      for (std::size_t i = 0; i < local.size(); ++i) {
        double mean = 0, mean_abs = 0;
        for (int r = 0; r < N; ++r) {
          mean += every[r * local.size() + i] / static_cast<double>(N);
          mean_abs += std::abs(every[r * local.size() + i]) / N;
        }
        const double bound = (N + 1) * u * mean_abs + N * std::ldexp(1.0, -24);
        const double err = std::abs(got[i] - mean);
        bad += !(err <= bound);
        worst_ratio = std::max(worst_ratio, err / bound);
        if (std::abs(mean) > 0.5 * mean_abs) {
          ++non_cancelling;
          catches_skipped_division += (N - 1) * std::abs(mean) > bound;
        }
      }
      const std::string what = compression + ", fusion " + std::to_string(s.fusion_mb) + " MB";
      EXPECT_EQ(bad, 0u) << what << ": worst err / bound = " << worst_ratio;
      if (std::getenv("DPTRAIN_TEST_VERBOSE") && test::rank() == 0)
        std::printf("%s: worst err / bound = %.3f, %zu of %zu elements non-cancelling\n", what.c_str(),
                    worst_ratio, non_cancelling, local.size());
      if (N > 1) {
        EXPECT_EQ(catches_skipped_division, non_cancelling) << what;
      }
      EXPECT_GT(non_cancelling, local.size() / 2) << what;
    }
}

// Gradients of 40000 and 60000 on every rank: a plain fp16 sum over N >= 2 ranks would pass 65504
// and overflow to inf. Pre-scaling by 1/N keeps every partial sum <= the average, which is finite.
TEST(GradientReducer, LargeGradientsAverageToAFiniteAccurateValue) {
  autograd::clear_tape();
  const int N = test::size();
  for (const std::string compression : {"fp16", "bf16"})
    for (float g : {40000.0f, 60000.0f}) {
      if (N >= 2) {
        ASSERT_GT(static_cast<double>(g) * N, 65504.0);
      }  // the unscaled sum would overflow fp16
      const Tensor w = Tensor::from_data({1, 1}, std::vector<float>{0.5f}, true);
      const Tensor b = Tensor::from_data({1}, std::vector<float>{0.0f}, true);
      MpiCommunicator comm(test::world());
      test::TestReducer reducer_owner(comm, {{"0.weight", w}, {"0.bias", b}},
                                      ReducerOptions{0, 1, true, compression});
      GradientReducer& reducer = reducer_owner.reducer;
      // d sum(x w^T + b) / dw = sum(x) = g; x: 4 rows of g / 4.
      const Tensor x = Tensor::full({4, 1}, g / 4);
      reducer.prepare(0);
      ops::sum(ops::linear(x, w, b)).backward(reducer.loss_scale(1));
      reducer.finish();
      const double bound = (N + 1) * unit_roundoff(compression) * g;
      EXPECT_TRUE(std::isfinite(w.grad()[0])) << compression << " " << g;
      EXPECT_NEAR(w.grad()[0], g, bound) << compression << " " << g;
      EXPECT_NEAR(b.grad()[0], 4.0, (N + 1) * unit_roundoff(compression) * 4) << compression;
    }
}

// ---------------------------------------------------------------------------------------------
// Non-finite gradients

// One rank's batch holds a NaN or an inf, so its weight gradient is not finite; after the allreduce
// every rank's average is not finite and finish() throws on every rank, naming step and parameter.
// The weight is registered first, so it sits in the last bucket: the throw comes after every
// bucket was waited on (an earlier bucket would leave later collectives in flight).
// In shared memory the sums are tested as they are made (Communicator::start_sum_testing_finite),
// through MPI by a pass over the result: both are run.
TEST(GradientReducer, NonFiniteGradientOnOneRankThrowsNamingStepBucketAndParameter) {
  if (test::size() == 1) GTEST_SKIP() << "one rank: see NonFiniteGradientThrowsInAWorldOfOneToo";
  autograd::clear_tape();
  const int bad_rank = test::size() - 1;
  for (bool shared_memory : {false, true})
    for (const std::string compression : {"none", "fp16", "bf16"})
      for (double fusion : {0.0, 128.0})
        for (float poison :
             {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
          const Tensor w = Tensor::from_data({2, 3}, std::vector<float>(6, 0.5f), true);
          const Tensor b = Tensor::from_data({2}, std::vector<float>(2, 0.0f), true);
          MpiCommunicator comm(test::world());
          test::TestReducer reducer_owner(comm, {{"dense_in.weight", w}, {"dense_in.bias", b}},
                                          ReducerOptions{fusion, 1, true, compression}, shared_memory);
          ASSERT_EQ(comm.reduces_in_shared_memory(reducer_owner.flat.grads().data_ptr()), shared_memory);
          GradientReducer& reducer = reducer_owner.reducer;
          std::vector<float> xs(4 * 3, 1.0f);
          if (test::rank() == bad_rank) xs[5] = poison;
          reducer.prepare(17);
          ops::sum(ops::linear(Tensor::from_data({4, 3}, xs), w, b)).backward(reducer.loss_scale(1));
          std::string message;
          try {
            reducer.finish();
          } catch (const Error& e) {
            message = e.what();
          }
          const std::string what = compression + ", fusion " + std::to_string(fusion) + ", poison " +
                                   std::to_string(poison) + (shared_memory ? ", shared memory" : ", MPI");
          EXPECT_FALSE(message.empty()) << what << ": finish() did not throw on rank " << test::rank();
          if (message.empty()) continue;
          EXPECT_NE(message.find("step 17"), std::string::npos) << what << ": " << message;
          EXPECT_NE(message.find("dense_in.weight"), std::string::npos) << what << ": " << message;
          EXPECT_NE(message.find(fusion == 0 ? "bucket 1" : "bucket 0"), std::string::npos)
              << what << ": " << message;
        }
}

// ---------------------------------------------------------------------------------------------
// Sharded (ZeRO-1): reduce-scatter into this rank's chunks, all-gather of the parameters

float largest_magnitude(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(x[i]));
  return m;
}

// The sharded reducer leaves the allreduce's average in this rank's chunks (bitwise on two ranks,
// where a + b has one order; within rounding on four, where MPI may order the sums otherwise).
// Standing in for the optimizer, each rank then writes its chunks of the average into the parameter
// values, and gather_parameters() must give every rank all of it.
TEST(GradientReducer, ShardedAverageLandsInThisRanksChunksAndTheGatherCompletesIt) {
  autograd::clear_tape();
  const int N = test::size();
  for (const std::string compression : {"none", "fp16"})
    for (const Setting& s : kSettings) {
      Chain plain_chain, sharded_chain;
      MpiCommunicator comm(test::world());
      test::TestReducer plain(comm, plain_chain.params,
                              ReducerOptions{s.fusion_mb, s.first_mb, s.overlap, compression});
      test::TestReducer sharded(comm, sharded_chain.params,
                                ReducerOptions{s.fusion_mb, s.first_mb, s.overlap, compression, true, true});
      const std::string what = compression + ", fusion " + std::to_string(s.fusion_mb) + " MB, overlap " +
                               (s.overlap ? "on" : "off");
      for (test::TestReducer* r : {&plain, &sharded}) {
        Chain& chain = r == &plain ? plain_chain : sharded_chain;
        chain.zero_grad();
        r->reducer.prepare(3);
        chain.backward(batch_of(test::rank()), r->reducer.loss_scale(1));
        r->reducer.finish();
      }
      const ShardLayout* layout = sharded.reducer.shard_layout();
      ASSERT_NE(layout, nullptr);
      ASSERT_EQ(layout->windows(), sharded.reducer.buckets().size());
      const float* expected = plain.flat.grads().data_ptr();
      const float tolerance = (N <= 2                  ? 0.0f
                               : compression == "none" ? 1e-6f
                                                       : 4e-3f) *
                              largest_magnitude(expected, plain.flat.size());
      float* values = sharded.flat.values().data_ptr();
      // Counted, not asserted: a rank that returned here would leave the others in the all-gather.
      int64_t wrong = 0, first_wrong = -1;
      for (const FlatRange& r : layout->owned())
        for (int64_t i = r.offset; i < r.end(); ++i) {
          if (!(std::abs(sharded.flat.grads().data_ptr()[i] - expected[i]) <= tolerance) && wrong++ == 0)
            first_wrong = i;
          values[i] = sharded.flat.grads().data_ptr()[i];
        }
      EXPECT_EQ(wrong, 0) << what << ": elements of this rank's chunks, first " << first_wrong;
      sharded.reducer.gather_parameters();
      const std::vector<float> gathered(values, values + sharded.flat.size());
      wrong = 0;
      for (int64_t i = 0; i < sharded.flat.size(); ++i)
        if (!(std::abs(gathered[static_cast<std::size_t>(i)] - expected[i]) <= tolerance) && wrong++ == 0)
          first_wrong = i;
      EXPECT_EQ(wrong, 0) << what << ": elements after the all-gather, first " << first_wrong;
      EXPECT_TRUE(test::bitwise_equal(test::root_copy(gathered), gathered)) << what;
    }
}

// Every rank stops naming the parameter and the rank whose chunk holds the non-finite average (one
// small allreduce agrees on both). On one rank it holds everything.
TEST(GradientReducer, ShardedNonFiniteAverageStopsEveryRankNamingTheOwner) {
  autograd::clear_tape();
  for (double fusion : {0.0, 128.0}) {
    const Tensor w = Tensor::from_data({2, 3}, std::vector<float>(6, 0.5f), true);
    const Tensor b = Tensor::from_data({2}, std::vector<float>(2, 0.0f), true);
    MpiCommunicator comm(test::world());
    test::TestReducer owner(comm, {{"dense_in.weight", w}, {"dense_in.bias", b}},
                            ReducerOptions{fusion, 1, true, "none", true, true});
    // The poisoned input column makes dense_in.weight's elements 2 and 5 NaN: who holds them? The
    // agreement reports the highest of those ranks.
    std::vector<int> holders;
    for (int r = 0; r < test::size(); ++r) {
      const ShardLayout layout(
          [&] {
            std::vector<FlatRange> windows;
            for (const Bucket& bucket : owner.reducer.buckets())
              windows.push_back({bucket.offset, bucket.numel});
            return windows;
          }(),
          test::size(), r);
      for (const FlatRange& range : layout.owned())
        for (int64_t element : {2, 5})
          if (range.offset <= owner.flat.offset(0) + element &&
              owner.flat.offset(0) + element < range.end() && std::ranges::find(holders, r) == holders.end())
            holders.push_back(r);
    }
    ASSERT_FALSE(holders.empty());
    const int reported = *std::ranges::max_element(holders);
    std::vector<float> xs(4 * 3, 1.0f);
    if (test::rank() == 0) xs[5] = std::numeric_limits<float>::quiet_NaN();
    owner.reducer.prepare(17);
    ops::sum(ops::linear(Tensor::from_data({4, 3}, xs), w, b)).backward(owner.reducer.loss_scale(1));
    std::string message;
    try {
      owner.reducer.finish();
    } catch (const Error& e) {
      message = e.what();
    }
    ASSERT_FALSE(message.empty()) << "fusion " << fusion << ": rank " << test::rank() << " did not stop";
    EXPECT_NE(message.find("non-finite averaged gradient in dense_in.weight (bucket "), std::string::npos)
        << message;
    EXPECT_NE(message.find("at step 17"), std::string::npos) << message;
    if (test::size() > 1) {
      EXPECT_NE(message.find("found in rank " + std::to_string(reported) + "'s shard"), std::string::npos)
          << message;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A world of one

// finish() documents "Throws if an average is not finite"; with one rank the average is the local
// gradient, and a NaN there must not be applied silently either (the same config would throw at
// 2 ranks).
TEST(GradientReducer, NonFiniteGradientThrowsInAWorldOfOneToo) {
  autograd::clear_tape();
  const Tensor w = Tensor::from_data({2, 3}, std::vector<float>(6, 0.5f), true);
  const Tensor b = Tensor::from_data({2}, std::vector<float>(2, 0.0f), true);
  test::SelfCommunicator self;
  test::TestReducer reducer_owner(self, {{"dense_in.weight", w}, {"dense_in.bias", b}}, ReducerOptions{});
  GradientReducer& reducer = reducer_owner.reducer;
  std::vector<float> xs(4 * 3, 1.0f);
  xs[5] = std::numeric_limits<float>::quiet_NaN();
  reducer.prepare(17);
  ops::sum(ops::linear(Tensor::from_data({4, 3}, xs), w, b)).backward();
  EXPECT_THROW(reducer.finish(), Error);
}

TEST(GradientReducer, WorldOfOneLeavesGradientsAlone) {
  autograd::clear_tape();
  Chain c;
  test::SelfCommunicator self;
  test::TestReducer reducer_owner(self, c.params, ReducerOptions{0, 1, true, "fp16"});
  GradientReducer& reducer = reducer_owner.reducer;
  c.zero_grad();
  reducer.prepare(0);
  c.backward(batch_of(test::rank(), 0), reducer.loss_scale(1));
  const std::vector<float> before = all_grads(c);
  EXPECT_NO_THROW(reducer.finish());
  EXPECT_TRUE(test::bitwise_equal(all_grads(c), before));
}

}  // namespace
}  // namespace dptrain::distributed
