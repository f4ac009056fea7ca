// FlatParameters: the layout (reverse order, 16-float aligned, zero padding), that the parameter
// tensors become windows of the flat buffers with their values kept, that windows never alias, and
// the per-parameter views of a slot buffer.
#include "core/parameters.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace dptrain {
namespace {

std::vector<NamedTensor> parameters(const std::vector<int64_t>& sizes) {
  std::vector<NamedTensor> out;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> values(sizes[k]);
    for (int64_t i = 0; i < sizes[k]; ++i) values[i] = static_cast<float>(1000 * k + i);
    out.push_back({"p" + std::to_string(k), Tensor::from_data({sizes[k]}, values, true)});
  }
  return out;
}

TEST(FlatParameters, LayoutIsReverseOrderAlignedAndPadded) {
  const std::vector<int64_t> sizes = {7, 1, 16, 33};
  const FlatParameters flat(parameters(sizes), Device::cpu());
  // Backward order: p3 (33 -> 48 with padding), p2 (16), p1 (1 -> 16), p0 (7 -> 16).
  EXPECT_EQ(flat.offset(3), 0);
  EXPECT_EQ(flat.offset(2), 48);
  EXPECT_EQ(flat.offset(1), 64);
  EXPECT_EQ(flat.offset(0), 80);
  EXPECT_EQ(flat.size(), 96);
  EXPECT_EQ(flat.numel(), 57);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const Tensor& p = flat.parameters()[k].tensor;
    EXPECT_EQ(p.data(), flat.values().data() + flat.offset(k)) << "p" << k << " views its place";
    EXPECT_EQ(p.grad_data(), flat.grads().data() + flat.offset(k))
        << "p" << k << "'s gradient views its place";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.data()) % 64, 0u);
    for (int64_t i = 0; i < sizes[k]; ++i)
      EXPECT_EQ(p.data()[i], static_cast<float>(1000 * k + i)) << "value kept";
  }
  // Padding: zero in both buffers.
  const std::vector<float> values = flat.values().to_vector(), grads = flat.grads().to_vector();
  for (int64_t i : {33, 47, 65, 79, 87, 95}) {
    EXPECT_EQ(values[i], 0.0f) << i;
    EXPECT_EQ(grads[i], 0.0f) << i;
  }
}

// Every parameter and gradient has memory of its own: distinct values written through each
// tensor read back unchanged through the tensor and through the flat buffer.
TEST(FlatParameters, WindowsDoNotAlias) {
  const std::vector<int64_t> sizes = {7, 1, 3, 1000, 2, 33};
  const std::vector<NamedTensor> params = parameters(sizes);
  const FlatParameters flat(params, Device::cpu());
  for (std::size_t k = 0; k < params.size(); ++k)
    for (int64_t i = 0; i < sizes[k]; ++i)
      params[k].tensor.grad_data()[i] = -static_cast<float>(1000 * k + i);
  std::size_t bad = 0;
  for (std::size_t k = 0; k < params.size(); ++k)
    for (int64_t i = 0; i < sizes[k]; ++i) {
      bad += params[k].tensor.grad()[i] != -static_cast<float>(1000 * k + i);
      bad += flat.grads().data()[flat.offset(k) + i] != -static_cast<float>(1000 * k + i);
      bad += params[k].tensor.values()[i] != static_cast<float>(1000 * k + i);
    }
  EXPECT_EQ(bad, 0u);
  flat.zero_grad();
  for (const NamedTensor& p : params)
    for (float g : p.tensor.grad()) EXPECT_EQ(g, 0.0f);
}

// Backward accumulates straight into the flat gradient buffer.
TEST(FlatParameters, BackwardWritesIntoTheFlatGradients) {
  autograd::clear_tape();
  const Tensor w = Tensor::from_data({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6}, true);
  const Tensor b = Tensor::from_data({2}, std::vector<float>{0.5f, -0.5f}, true);
  const FlatParameters flat({{"w", w}, {"b", b}}, Device::cpu());
  const Tensor x = Tensor::from_data({1, 3}, std::vector<float>{1, 10, 100});
  ops::sum(ops::linear(x, w, b)).backward();
  const float* g = flat.grads().data();
  EXPECT_EQ(g[flat.offset(1)], 1.0f);        // d/db
  EXPECT_EQ(g[flat.offset(0) + 2], 100.0f);  // d/dw[0, 2] = x[2]
  EXPECT_EQ(g[flat.offset(0) + 5], 100.0f);
}

TEST(FlatParameters, SlotWindowsAreNamedAndShaped) {
  const FlatParameters flat({{"a", Tensor::zeros({2, 3}, true)}, {"b", Tensor::zeros({5}, true)}},
                            Device::cpu());
  const Tensor slot = flat.new_buffer();
  EXPECT_EQ(slot.numel(), flat.size());
  const std::vector<NamedTensor> windows = flat.windows(slot, "exp_avg");
  ASSERT_EQ(windows.size(), 2u);
  EXPECT_EQ(windows[0].name, "a.exp_avg");
  EXPECT_EQ(windows[0].tensor.shape(), (Shape{2, 3}));
  EXPECT_EQ(windows[1].name, "b.exp_avg");
  EXPECT_EQ(windows[1].tensor.data(), slot.data() + flat.offset(1));
  EXPECT_THROW(flat.windows(Tensor::zeros({3}, Device::cpu()), "x"), Error);
  EXPECT_THROW(FlatParameters({{"undefined", Tensor()}}, Device::cpu()), Error);
}

// On another device (the reference backend's memory) the values travel along.
TEST(FlatParameters, MovesParametersToItsDevice) {
  const std::vector<NamedTensor> params = parameters({5, 20});
  const FlatParameters flat(params, Device::reference());
  EXPECT_EQ(params[0].tensor.device(), Device::reference());
  EXPECT_EQ(params[1].tensor.to_vector()[19], 1019.0f);
}

}  // namespace
}  // namespace dptrain
