// The autograd tape: accumulation, no-grad mode, gradient buffers only where needed, the
// grad-ready hook on leaves, and errors.
#include "core/autograd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace dptrain {
namespace {

class Autograd : public ::testing::Test {
 protected:
  void SetUp() override { autograd::clear_tape(); }
  void TearDown() override { autograd::clear_tape(); }
};

Tensor values(const Shape& shape, std::vector<float> v, bool requires_grad = false) {
  return Tensor::from_data(shape, v, requires_grad);
}

// loss = sum(x W^T): d loss / d W[o, i] = sum over the batch of x[b, i].
TEST_F(Autograd, GradientsAccumulateUntilZeroGrad) {
  const Tensor x = values({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor w = values({2, 3}, {0.5f, -1, 2, 1, 0, -0.5f}, true);
  const std::vector<float> once{5, 7, 9, 5, 7, 9};

  ops::sum(ops::linear(x, w, Tensor())).backward();
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(w.grad()[i], once[i]);
  ops::sum(ops::linear(x, w, Tensor())).backward();
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(w.grad()[i], 2 * once[i]);
  w.zero_grad();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w.grad()[i], 0.0f);
  ops::sum(ops::linear(x, w, Tensor())).backward();
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(w.grad()[i], once[i]);
}

TEST_F(Autograd, BackwardClearsTheTape) {
  const Tensor w = values({3}, {1, 2, 3}, true);
  const Tensor loss = ops::sum(ops::tanh(w));
  EXPECT_EQ(autograd::tape_size(), 2u);
  loss.backward();
  EXPECT_EQ(autograd::tape_size(), 0u);
}

TEST_F(Autograd, NoGradGuardRecordsNothing) {
  const Tensor x = values({2, 3}, {1, 2, 3, 4, 5, 6}, true);
  const Tensor w = values({4, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, true);
  const Tensor b = values({4}, {0.1f, 0.2f, 0.3f, 0.4f}, true);
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    const Tensor h = ops::relu(ops::linear(x, w, b));
    const Tensor loss = ops::cross_entropy(h, std::vector<int32_t>{1, 3});
    const Tensor s = ops::sum(ops::sigmoid(ops::flatten(h)));
    EXPECT_EQ(autograd::tape_size(), 0u);
    EXPECT_FALSE(h.requires_grad());
    EXPECT_FALSE(loss.requires_grad());
    EXPECT_FALSE(s.requires_grad());
    EXPECT_THROW(loss.backward(), Error);  // nothing to differentiate
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled()) << "a nested guard must restore the outer (disabled) state";
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_FALSE(x.has_grad());
  EXPECT_FALSE(w.has_grad());
  // Recording resumes after the guard.
  const Tensor h = ops::linear(x, w, b);
  EXPECT_TRUE(h.requires_grad());
  EXPECT_EQ(autograd::tape_size(), 1u);
}

TEST_F(Autograd, OpsOnConstantsRecordNothing) {
  const Tensor x = values({2, 2}, {1, 2, 3, 4});
  const Tensor y = ops::sum(ops::tanh(ops::matmul(x, x)));
  EXPECT_EQ(autograd::tape_size(), 0u);
  EXPECT_FALSE(y.requires_grad());
}

TEST_F(Autograd, InputsThatNeedNoGradGetNoBuffer) {
  const Tensor x = values({2, 1, 4, 4}, std::vector<float>(32, 0.5f));
  const Tensor w = values({2, 1, 3, 3}, std::vector<float>(18, 0.1f), true);
  const Tensor b = values({2}, {0.0f, 0.1f});  // a constant bias
  const Tensor target = values({2, 2, 2, 2}, std::vector<float>(16, 0.0f));
  const Tensor loss = ops::mse(ops::conv2d(x, w, b), target);
  loss.backward();
  EXPECT_TRUE(w.has_grad());
  EXPECT_FALSE(x.has_grad());
  EXPECT_FALSE(b.has_grad());
  EXPECT_FALSE(target.has_grad());
  // Matmul with only the right operand trainable.
  const Tensor a = values({2, 2}, {1, 2, 3, 4});
  const Tensor m = values({2, 2}, {1, 0, 0, 1}, true);
  ops::sum(ops::matmul(a, m)).backward();
  EXPECT_FALSE(a.has_grad());
  EXPECT_TRUE(m.has_grad());
  // d sum(a m) / d m[k, j] = sum_i a[i, k]
  EXPECT_FLOAT_EQ(m.grad()[0], 4.0f);
  EXPECT_FLOAT_EQ(m.grad()[1], 4.0f);
  EXPECT_FLOAT_EQ(m.grad()[2], 6.0f);
  EXPECT_FLOAT_EQ(m.grad()[3], 6.0f);
}

// w is used by two ops; its hook must fire once, after the second (earliest recorded) use has
// contributed, so the gradient it sees is final.
TEST_F(Autograd, GradReadyHookFiresOnceAfterLastUse) {
  const Tensor x = values({1, 2}, {1.0f, -2.0f});
  const Tensor w = values({2, 2}, {0.5f, 0.25f, -0.75f, 1.0f}, true);
  const Tensor v = values({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f}, true);
  int w_calls = 0, v_calls = 0;
  std::vector<float> w_seen;
  const GradHook w_hook = w.on_grad_ready([&] {
    ++w_calls;
    w_seen.assign(w.grad().begin(), w.grad().end());
  });
  const GradHook v_hook = v.on_grad_ready([&] {
    ++v_calls;
    EXPECT_EQ(w_calls, v_calls - 1) << "v is used last in the forward pass, so its gradient is ready first";
  });

  // h = tanh(x W^T); y = h W^T; z = y V^T; loss = sum(z)
  const auto forward = [&] {
    const Tensor h = ops::tanh(ops::linear(x, w, Tensor()));
    const Tensor y = ops::linear(h, w, Tensor());
    return ops::sum(ops::linear(y, v, Tensor()));
  };
  forward().backward();
  EXPECT_EQ(w_calls, 1);
  EXPECT_EQ(v_calls, 1);
  ASSERT_EQ(w_seen.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(w_seen[i], w.grad()[i]) << "hook saw a partial gradient at " << i;

  // Reference gradient by hand (double): h = tanh(W x), y = W h, loss = 1^T V y = u^T y, u = V^T 1.
  const double W[2][2] = {{0.5, 0.25}, {-0.75, 1.0}}, X[2] = {1.0, -2.0};
  const double u[2] = {1.0 + 3.0, 2.0 + 4.0};
  double a[2], h[2];
  for (int i = 0; i < 2; ++i) {
    a[i] = W[i][0] * X[0] + W[i][1] * X[1];
    h[i] = std::tanh(a[i]);
  }
  // d loss/dW = u h^T (second use) + diag(1 - h^2) (W^T u) x^T (first use)
  double wtu[2] = {W[0][0] * u[0] + W[1][0] * u[1], W[0][1] * u[0] + W[1][1] * u[1]};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const double expected = u[i] * h[j] + (1.0 - h[i] * h[i]) * wtu[i] * X[j];
      EXPECT_NEAR(w.grad()[i * 2 + j], expected, 1e-5) << i << "," << j;
    }

  // A second iteration fires again exactly once.
  forward().backward();
  EXPECT_EQ(w_calls, 2);
  EXPECT_EQ(v_calls, 2);

  // A forward whose tape is dropped must not leave uses pending: the next backward still fires.
  forward();
  autograd::clear_tape();
  forward().backward();
  EXPECT_EQ(w_calls, 3);
  EXPECT_EQ(v_calls, 3);
}

// Several hooks on one tensor all fire; a hook whose handle is gone never does again.
TEST_F(Autograd, GradReadyHooksAreIndependentAndRemovedWithTheirHandle) {
  const Tensor w = values({2}, {0.5f, -1.0f}, true);
  int first = 0, second = 0;
  GradHook first_hook = w.on_grad_ready([&] { ++first; });
  {
    const GradHook second_hook = w.on_grad_ready([&] { ++second; });
    ops::sum(ops::tanh(w)).backward();
    EXPECT_EQ(first, 1);
    EXPECT_EQ(second, 1);
  }
  ops::sum(ops::tanh(w)).backward();
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 1) << "the second hook's handle was destroyed";
  first_hook.reset();
  ops::sum(ops::tanh(w)).backward();
  EXPECT_EQ(first, 2);
}

// backward() from a non-scalar root takes the upstream gradient as given.
TEST_F(Autograd, BackwardWithAnUpstreamGradient) {
  const Tensor w = values({3}, {1.0f, -2.0f, 0.5f}, true);
  const Tensor upstream = values({3}, {0.25f, 1.0f, -3.0f});
  autograd::backward(ops::relu(w), upstream);
  EXPECT_EQ(w.grad()[0], 0.25f);
  EXPECT_EQ(w.grad()[1], 0.0f);
  EXPECT_EQ(w.grad()[2], -3.0f);
}

TEST_F(Autograd, BackwardOnNonScalarThrows) {
  const Tensor w = values({2, 2}, {1, 2, 3, 4}, true);
  const Tensor y = ops::tanh(w);
  try {
    y.backward();
    FAIL() << "backward on a [2, 2] tensor must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scalar"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 2]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(w.has_grad());
}

TEST_F(Autograd, BackwardOnConstantThrows) {
  const Tensor c = values({1}, {3.0f});
  EXPECT_THROW(c.backward(), Error);
}

}  // namespace
}  // namespace dptrain
