// Horovod's documented two-rank walkthrough of one data-parallel SGD step, number for number:
// one Dense(2 -> 3) with bias, loss = sum(output), SGD with lr 1.0, rank 0 starting from all ones
// and rank 1 from all zeros, each with its own 4x2 batch. Only meaningful with exactly two ranks.
//
// By hand: d loss / d W[o, :] = column sums of the batch (the same for all 3 rows), d loss / d b = 4.
//   rank 0: [2.0128188, 2.7977395]   rank 1: [0.75015247, 1.4605565]   average [1.3814857, 2.129148]
// After the averaged step (no broadcast first): rank 0 W = 1 - avg, b = 1 - 4; rank 1 W = 0 - avg,
// b = 0 - 4. broadcast_state then gives both ranks rank 0's values.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "distributed/reducer.h"
#include "distributed/state_sync.h"
#include "layers/module.h"
#include "mpi_test_env.h"
#include "optim/optimizer.h"

namespace dptrain::distributed {
namespace {

constexpr double kTol = 1e-6;

void expect_rows(const Tensor& t, std::array<double, 2> row, const char* what) {
  ASSERT_EQ(t.numel(), 6);
  for (int o = 0; o < 3; ++o)
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(t.data()[o * 2 + i], row[i], kTol) << what << " [" << o << ", " << i << "]";
    }
}
void expect_grad_rows(const Tensor& t, std::array<double, 2> row, const char* what) {
  for (int o = 0; o < 3; ++o)
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(t.grad()[o * 2 + i], row[i], kTol) << what << " [" << o << ", " << i << "]";
    }
}
void expect_all(std::span<const float> v, double value, const char* what) {
  for (std::size_t k = 0; k < v.size(); ++k) {
    EXPECT_NEAR(v[k], value, kTol) << what << " [" << k << "]";
  }
}

// With overlap on, a bucket's allreduce may run in place on the gradients while backward goes on,
// so the local gradients are inspected only with overlap off.
TEST(HorovodWalkthrough, TwoRankSgdStepThenBroadcast) {
  if (test::size() != 2)
    GTEST_SKIP() << "Horovod's walkthrough is for exactly 2 ranks (world size " << test::size() << ")";
  const int r = test::rank();
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap on" : "overlap off");
    autograd::clear_tape();
    layers::Dense dense("0", 2, 3, /*bias=*/true);
    for (float& w : dense.weight().values()) w = r == 0 ? 1.0f : 0.0f;
    for (float& b : dense.bias().values()) b = r == 0 ? 1.0f : 0.0f;
    const std::vector<float> x0 = {0.54881352f, 0.71518934f, 0.60276335f, 0.54488319f,
                                   0.42365479f, 0.64589411f, 0.43758720f, 0.89177299f};
    const std::vector<float> x1 = {0.41702199f, 0.72032452f, 0.000114374816f, 0.30233258f,
                                   0.14675589f, 0.09233859f, 0.18626021f,     0.34556073f};
    const Tensor x = Tensor::from_data({4, 2}, r == 0 ? x0 : x1);

    MpiCommunicator comm(test::world());
    const FlatParameters flat(dense.named_parameters(), Device::cpu());
    optim::Sgd sgd(flat, optim::SgdOptions{});
    GradientReducer reducer(comm, flat, {.overlap = overlap});
    sgd.zero_grad();
    reducer.prepare(0);
    ops::sum(dense.forward(x)).backward(reducer.loss_scale(1));

    if (!overlap) {  // local gradients, before the reducer sums them: Horovod's, divided by the 2 ranks
      expect_grad_rows(dense.weight(),
                       r == 0 ? std::array<double, 2>{2.0128188 / 2, 2.7977395 / 2}
                              : std::array<double, 2>{0.75015247 / 2, 1.4605565 / 2},
                       "local kernel gradient");
      expect_all(dense.bias().grad(), 4.0 / 2, "local bias gradient");
    }

    reducer.finish();
    expect_grad_rows(dense.weight(), {1.3814857, 2.129148}, "averaged kernel gradient");
    expect_all(dense.bias().grad(), 4.0, "averaged bias gradient");

    sgd.step(1.0f);
    if (r == 0) {
      expect_rows(dense.weight(), {-0.3814857, -1.129148}, "rank 0 kernel after the step");
      expect_all(dense.bias().values(), -3.0, "rank 0 bias after the step");
    } else {
      expect_rows(dense.weight(), {-1.3814857, -2.129148}, "rank 1 kernel after the step");
      expect_all(dense.bias().values(), -4.0, "rank 1 bias after the step");
    }

    int64_t steps = sgd.steps_taken();
    broadcast_state(comm, {flat.values()}, std::span<int64_t>(&steps, 1));
    expect_rows(dense.weight(), {-0.3814857, -1.129148}, "kernel after broadcast_state");
    expect_all(dense.bias().values(), -3.0, "bias after broadcast_state");
    EXPECT_EQ(steps, 1);
  }
}

}  // namespace
}  // namespace dptrain::distributed
