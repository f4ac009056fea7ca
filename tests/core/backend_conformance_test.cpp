// backend_conformance (ggml's test-backend-ops): a table of cases, (op, shapes, options), each run
// forward and backward on every backend under test and on the reference backend (naive loops in
// double, core/reference/), through the same device-neutral op. Backward starts from a random
// upstream gradient and runs twice, so every input gradient is compared after accumulating two
// passes, and the second pass must have added exactly what the first did (gradients accumulate, not
// overwrite; the first pass writes the new buffers where its kernels take a GradientOut). Both
// optimizers are run for three steps over flat buffers and compared, state included.
//
// Error: ||backend - reference|| / ||reference|| over the tensor (its norm alone when the reference
// is zero), against a per-case tolerance: 0 means bitwise equal (relu, max-pooling, reshape,
// dropout, bias forward, casts: no rounding differs). GEMM-like cases allow 1e-5 (float partial sums
// in another order than the reference's double ones: about sqrt(K) 2^-24), pointwise transcendental
// functions and losses 1e-6 (float libm against double, one rounding each).
//
// Backends under test: "cpu" always; every other registered backend (the CUDA backend registers
// each GPU) too. DPTRAIN_REQUIRE_GPU=1 turns "no GPU backend registered" into a failure, so a GPU
// machine cannot report green without running the GPU rows. The table is printed at the end.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "core/parameters.h"
#include "core/rng.h"
#include "core/storage.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"
#if defined(DPTRAIN_WITH_CUDA)
#include "cuda/device.h"
#include "cuda/runtime.h"
#endif

namespace dptrain {
namespace {

// ---- inputs ----

enum class Fill {
  kUniform,   // U(-1, 1)
  kDistinct,  // all different, 0.05 apart, shuffled: no ties in a pooling window
  kTies,      // {-0.5, 0, 0.5}: many ties, to check that every backend breaks them alike
  kPositive,  // U(0.5, 2): targets and the like
};

struct Input {
  Shape shape;
  Fill fill = Fill::kUniform;
  bool differentiable = true;
};

std::vector<float> host_values(const Input& in, uint64_t seed) {
  const int64_t n = shape_numel(in.shape);
  std::vector<float> v(static_cast<std::size_t>(n));
  Rng rng(seed);
  switch (in.fill) {
    case Fill::kUniform:
      for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
      break;
    case Fill::kPositive:
      for (float& x : v) x = rng.uniform(0.5f, 2.0f);
      break;
    case Fill::kTies:
      for (float& x : v) x = 0.5f * static_cast<float>(static_cast<int>(rng.below(3)) - 1);
      break;
    case Fill::kDistinct:
      for (int64_t i = 0; i < n; ++i) v[i] = 0.05f * static_cast<float>(i) - 0.025f * static_cast<float>(n);
      for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(static_cast<uint64_t>(i + 1))]);
      break;
  }
  return v;
}

// ---- comparison ----

// ||a - b|| / ||b||, or ||a|| when b is zero; 0 exactly when bitwise equal up to the sign of zeros.
double error_of(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

using test_util::bitwise_equal;

// Passes when bitwise equal for tolerance 0, else when the error is within it (NaN fails).
bool within(const std::vector<float>& a, const std::vector<float>& b, double tolerance) {
  return tolerance == 0 ? bitwise_equal(a, b) : error_of(a, b) <= tolerance;
}

// For sums that meet Inf in an order of their own (cuDNN's): the same elements are non-finite in
// both (Inf + -Inf is NaN in one order and Inf in none, so which of the two is not compared), and the
// finite rest is within the tolerance.
bool within_where_finite(const std::vector<float>& a, const std::vector<float>& b, double tolerance) {
  if (a.size() != b.size()) return false;
  std::vector<float> finite_a, finite_b;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(a[i]) != std::isfinite(b[i])) return false;
    if (std::isfinite(a[i])) finite_a.push_back(a[i]), finite_b.push_back(b[i]);
  }
  return within(finite_a, finite_b, tolerance);
}

// ---- the table that is printed at the end ----

struct Row {
  std::string op, shapes, backend;
  double forward = 0;
  std::vector<double> gradients;
  double tolerance = 0;
  bool ok = false;
};
std::vector<Row>& rows() {
  static std::vector<Row> all;
  return all;
}

std::vector<Device> devices_under_test() {
  std::vector<Device> out = {Device::cpu()};
  for (int i = 0; i < 16; ++i)
    if (has_backend(Device::cuda(i))) out.push_back(Device::cuda(i));
  return out;
}

// ---- ops ----

struct Case {
  std::string op, shapes;
  std::vector<Input> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> run;
  double tolerance;
};
// gtest names a failing row by this rather than by the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.op << " (" << c.shapes << ")";
}

struct Outcome {
  std::vector<float> output;
  std::vector<std::vector<float>> gradients_once, gradients_twice;  // per differentiable input
  // Each constant input after both passes: state an op moves in place (BatchNorm's running
  // statistics) is compared too, and every other constant must come back as it went in.
  std::vector<std::vector<float>> constants_after;
};

// `poison`, when given, edits the upstream gradient (on the host) before backward.
Outcome run_case(const Case& c, Device device, const std::function<void(std::vector<float>&)>& poison = {}) {
  autograd::clear_tape();
  std::vector<Tensor> inputs;
  for (std::size_t k = 0; k < c.inputs.size(); ++k) {
    const Tensor host = Tensor::from_data(c.inputs[k].shape, host_values(c.inputs[k], 100 + k));
    Tensor t = host.to(device);
    if (t.same_as(host)) t = host.clone();  // an input of its own on every device
    t.set_requires_grad(c.inputs[k].differentiable);
    inputs.push_back(t);
  }
  Outcome out;
  for (int pass = 0; pass < 2; ++pass) {
    const Tensor y = c.run(inputs);
    if (pass == 0) out.output = y.to_vector();
    std::vector<float> upstream_values = host_values({y.shape(), Fill::kUniform, false}, 7);
    if (poison) poison(upstream_values);
    const Tensor upstream = Tensor::from_data(y.shape(), upstream_values).to(device);
    autograd::backward(y, upstream);
    for (const Tensor& t : inputs)
      if (t.requires_grad()) {
        std::vector<float> g(static_cast<std::size_t>(t.numel()));
        backend_for(device).copy_to_host(g.data(), t.grad_ptr(), g.size() * sizeof(float));
        (pass == 0 ? out.gradients_once : out.gradients_twice).push_back(std::move(g));
      }
  }
  for (const Tensor& t : inputs)
    if (!t.requires_grad()) out.constants_after.push_back(t.to_vector());
  return out;
}

// One backend's outcome against the reference's: a row of the table.
void check_against(const Case& c, const std::string& backend, const Outcome& got, const Outcome& reference) {
  Row row{c.op, c.shapes, backend, error_of(got.output, reference.output), {}, c.tolerance, true};
  row.ok = within(got.output, reference.output, c.tolerance);
  EXPECT_TRUE(within(got.output, reference.output, c.tolerance))
      << c.op << " " << c.shapes << " on " << backend << ": forward error " << row.forward;
  for (std::size_t k = 0; k < got.gradients_twice.size(); ++k) {
    const double e = error_of(got.gradients_twice[k], reference.gradients_twice[k]);
    row.gradients.push_back(e);
    const bool close = within(got.gradients_twice[k], reference.gradients_twice[k], c.tolerance);
    // The second pass added what the first produced: twice the first, up to the rounding of adding
    // into a non-zero buffer (an overwrite would be off by half).
    std::vector<float> doubled = got.gradients_once[k];
    for (float& v : doubled) v *= 2;
    const bool accumulated = error_of(got.gradients_twice[k], doubled) <= std::max(c.tolerance, 1e-6);
    row.ok = row.ok && close && accumulated;
    EXPECT_TRUE(close) << c.op << " " << c.shapes << " on " << backend << ": gradient of input " << k
                       << " error " << e;
    EXPECT_TRUE(accumulated) << c.op << " " << c.shapes << " on " << backend << ": the gradient of input "
                             << k << " did not accumulate over two passes";
  }
  ASSERT_EQ(got.constants_after.size(), reference.constants_after.size());
  for (std::size_t k = 0; k < got.constants_after.size(); ++k) {
    const double e = error_of(got.constants_after[k], reference.constants_after[k]);
    const bool close = within(got.constants_after[k], reference.constants_after[k], c.tolerance);
    if (e > 0) row.gradients.push_back(e);  // a column only for state the op moved or got wrong
    row.ok = row.ok && close;
    EXPECT_TRUE(close) << c.op << " " << c.shapes << " on " << backend << ": constant input " << k
                       << " (state moved in place) differs from the reference's by " << e;
  }
  rows().push_back(row);
}

void check(const Case& c) {
  const Outcome reference = run_case(c, Device::reference());
  // The CPU's convolutions three times: with Winograd where it applies (the default: F(2x2, 3x3), the
  // weight gradient F(4x4, 3x3)), with F(4x4, 3x3) throughout, and without, so that every form stays
  // covered at the shapes that Winograd takes.
  const std::vector<std::pair<CpuOptions, std::string>> cpu_forms = {
      {{}, ""}, {{.winograd_tile = 4}, " F4"}, {{.winograd = false}, " direct"}};
  for (const Device device : devices_under_test())
    for (const auto& [options, form] : cpu_forms) {
      if (!form.empty() && !(device == Device::cpu() && c.op.rfind("conv2d", 0) == 0)) continue;
      set_cpu_options(options);
      const Outcome got = run_case(c, device);
      set_cpu_options({});
      check_against(c, device.str() + form, got, reference);
    }
}

Input in(Shape shape, Fill fill = Fill::kUniform) {
  return {std::move(shape), fill, true};
}
Input constant(Shape shape, Fill fill = Fill::kUniform) {
  return {std::move(shape), fill, false};
}

constexpr double kGemm = 1e-5, kPointwise = 1e-6, kExact = 0;

// A fused conv2d -> ReLU -> max pooling, and the same as the three ops.
struct ConvPool {
  Shape x, w;
  int stride, padding;
  ops::MaxPool2dOptions pool;
  bool bias;

  std::string describe() const {
    return "x " + shape_str(x) + ", w " + shape_str(w) + ", stride " + std::to_string(stride) + ", pad " +
           std::to_string(padding) + (bias ? ", bias" : ", no bias") + "; pool " +
           std::to_string(pool.kernel) + ", stride " + std::to_string(pool.stride) + ", pad " +
           std::to_string(pool.padding);
  }
  std::vector<Input> inputs() const {
    std::vector<Input> out = {{x, Fill::kUniform, true}, {w, Fill::kUniform, true}};
    if (bias) out.push_back({{w[0]}, Fill::kUniform, true});
    return out;
  }
  Tensor fused(const std::vector<Tensor>& t) const {
    return ops::conv2d_relu_maxpool(t[0], t[1], bias ? t[2] : Tensor(), {stride, padding, true}, pool);
  }
  Tensor parts(const std::vector<Tensor>& t) const {
    return ops::maxpool2d(ops::conv2d(t[0], t[1], bias ? t[2] : Tensor(), {stride, padding, true}),
                          pool.kernel, pool.stride, pool.padding);
  }
};
std::vector<ConvPool> conv_pool_cases() {
  return {{{4, 1, 28, 28}, {32, 1, 3, 3}, 1, 0, {2, 2, 0}, true},
          {{4, 32, 13, 13}, {64, 32, 3, 3}, 1, 0, {2, 2, 0}, true},
          {{12, 8, 20, 20}, {6, 8, 3, 3}, 1, 0, {2, 2, 0}, true},
          {{2, 3, 13, 12}, {4, 3, 3, 3}, 1, 1, {3, 2, 1}, false},
          {{3, 2, 11, 11}, {5, 2, 3, 3}, 2, 1, {2, 1, 0}, true},
          {{2, 16, 10, 10}, {24, 16, 3, 3}, 1, 1, {2, 2, 0}, true}};  // by Winograd's F2 (and F4)
}
// Over 2.2M elements, for the pointwise kernels' multi-threaded and multi-block paths.
const Shape kLarge = {2, 1100, 1024};

std::string str(const Shape& s) {
  return shape_str(s);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // matmul: a [M, K] x b [K, N]
  for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 13, 257}, {64, 128, 33}})
    out.push_back({"matmul",
                   str({m, k}) + " x " + str({k, n}),
                   {in({m, k}), in({k, n})},
                   [](const std::vector<Tensor>& t) { return ops::matmul(t[0], t[1]); },
                   kGemm});
  // linear: x [B, in], weight [out, in], bias [out] (and without bias)
  for (const auto& [b, i, o] :
       std::vector<std::array<int64_t, 3>>{{1, 7, 13}, {13, 257, 7}, {128, 1600, 64}}) {
    out.push_back({"linear",
                   "x " + str({b, i}) + ", w " + str({o, i}) + ", bias",
                   {in({b, i}), in({o, i}), in({o})},
                   [](const std::vector<Tensor>& t) { return ops::linear(t[0], t[1], t[2]); },
                   kGemm});
  }
  out.push_back({"linear",
                 "x [7, 13], w [257, 13], no bias",
                 {in({7, 13}), in({257, 13})},
                 [](const std::vector<Tensor>& t) { return ops::linear(t[0], t[1], Tensor()); },
                 kGemm});
  // add_bias: x [B, C, ...] + bias [C]; the bias gradient sums over the rest
  out.push_back({"add_bias",
                 "x [2, 3, 7, 13], bias [3]",
                 {in({2, 3, 7, 13}), in({3})},
                 [](const std::vector<Tensor>& t) { return ops::add_bias(t[0], t[1]); },
                 kGemm});
  out.push_back({"add_bias",
                 "x [1, 257], bias [257]",
                 {in({1, 257}), in({257})},
                 [](const std::vector<Tensor>& t) { return ops::add_bias(t[0], t[1]); },
                 kGemm});
  out.push_back({"add_bias",
                 "x " + str(kLarge) + ", bias [1100]",
                 {in(kLarge), in({1100})},
                 [](const std::vector<Tensor>& t) { return ops::add_bias(t[0], t[1]); },
                 kGemm});
  // conv2d: x [B, C, H, W], w [O, C, KH, KW], bias [O]; strides, padding, the fused ReLU, no bias
  struct Conv {
    Shape x, w;
    int stride, padding;
    bool relu, bias;
  };
  for (const Conv& v : std::vector<Conv>{{{1, 1, 7, 13}, {3, 1, 3, 3}, 1, 0, false, true},
                                         {{2, 3, 13, 13}, {4, 3, 3, 3}, 2, 1, false, true},
                                         {{3, 2, 9, 7}, {5, 2, 5, 5}, 1, 2, true, true},
                                         {{2, 4, 8, 8}, {3, 4, 1, 1}, 1, 0, false, false},
                                         {{1, 3, 7, 7}, {2, 3, 7, 7}, 1, 0, true, false},
                                         {{8, 32, 13, 13}, {64, 32, 3, 3}, 1, 0, true, true},
                                         // the CPU's direct kernels both ways over planes large enough
                                         // for them: 5 packets of input channels, padding 1 and 2,
                                         // output channels and pixels that leave a tail
                                         {{2, 80, 16, 16}, {36, 80, 3, 3}, 1, 1, false, true},
                                         {{2, 20, 24, 24}, {24, 20, 5, 5}, 1, 2, true, false},
                                         {{2, 40, 15, 15}, {84, 40, 3, 3}, 1, 1, true, true},
                                         // per-tap GEMMs both ways (ResNet's 3x3 over 8x8; the direct
                                         // backward until 2026-12-06, whose tails the 15x15 row above
                                         // keeps): 2.5 and 5 packets of input channels, the ReLU-masked
                                         // output gradient transposed with a channel tail and a pixel
                                         // tail; 1x1 and rows of 6 for 4 outputs go to im2col
                                         {{2, 40, 7, 9}, {80, 40, 3, 3}, 1, 1, true, true},
                                         {{2, 80, 8, 8}, {36, 80, 3, 3}, 1, 1, false, false},
                                         {{2, 40, 7, 9}, {84, 40, 3, 3}, 1, 1, true, false},
                                         {{3, 72, 6, 6}, {36, 72, 2, 2}, 1, 1, false, false},
                                         {{2, 48, 5, 5}, {20, 48, 1, 1}, 1, 0, false, true},
                                         // per-tap GEMMs over small planes (3x3 over 4x4 and 2x2, a
                                         // 5x5 over 3x3 whose outer taps reach one row or none, a
                                         // 2x2 that pads to a larger output), ragged channels and
                                         // batches
                                         {{2, 16, 4, 4}, {24, 16, 3, 3}, 1, 1, true, true},
                                         {{3, 24, 2, 2}, {40, 24, 3, 3}, 1, 1, false, true},
                                         {{5, 33, 4, 4}, {17, 33, 3, 3}, 1, 1, true, false},
                                         {{2, 20, 3, 3}, {18, 20, 5, 5}, 1, 2, false, true},
                                         {{2, 20, 2, 2}, {18, 20, 5, 5}, 1, 2, true, true},
                                         {{3, 24, 3, 3}, {16, 24, 2, 2}, 1, 1, true, true},
                                         // per-tap GEMMs at stride 2 over the input's even and odd rows
                                         // and columns: both ways (3x3/2 to 4x4, an odd plane whose odd
                                         // phase is a row and a column short, a 5x5/2), and the forward
                                         // only (3x3/2 to 8x8)
                                         {{2, 16, 8, 8}, {24, 16, 3, 3}, 2, 1, true, true},
                                         {{3, 20, 7, 7}, {18, 20, 3, 3}, 2, 1, false, true},
                                         {{2, 16, 6, 6}, {16, 16, 5, 5}, 2, 2, true, false},
                                         {{2, 16, 16, 16}, {20, 16, 3, 3}, 2, 1, false, true},
                                         // ... an even kernel over an odd plane, and a 3x1 kernel
                                         {{2, 16, 5, 5}, {16, 16, 2, 2}, 2, 1, true, true},
                                         {{2, 16, 7, 6}, {16, 16, 3, 1}, 2, 1, false, true},
                                         // the weight gradient's staged blocks at 16 taps (a 4x4 kernel
                                         // over 2x2 to one pixel) and at 12 (3x4)
                                         {{1, 32, 2, 2}, {32, 32, 4, 4}, 1, 1, false, true},
                                         {{2, 24, 3, 3}, {16, 24, 3, 4}, 1, 1, true, false},
                                         // 1x1 over planes of 961 and 1,024: one-sample chunks that
                                         // read and write the tensors in place, at samples not 64-byte
                                         // aligned (bias and ReLU in place, or the ReLU-masked gradient
                                         // through a copy)
                                         {{2, 65, 31, 31}, {130, 65, 1, 1}, 1, 0, false, true},
                                         {{2, 64, 32, 32}, {128, 64, 1, 1}, 1, 0, true, false},
                                         // weights over 1 MiB: small-plane forward, im2col backward
                                         {{1, 128, 6, 6}, {256, 128, 3, 3}, 1, 1, true, true},
                                         // the GEMM's edges at stride 2 (ResNet's downsampling), through
                                         // im2col (12 channels are too few for per-tap GEMMs): 50 and
                                         // 98 columns, a ragged last block of them, 36 and 20 rows
                                         {{2, 12, 9, 9}, {36, 12, 3, 3}, 2, 1, true, false},
                                         {{2, 36, 14, 14}, {20, 36, 1, 1}, 2, 0, false, true},
                                         // a ResNet stem (7x7/2, padding 3), whose im2col copies from
                                         // rows split into even and odd columns: an odd width and an
                                         // even one
                                         {{2, 3, 15, 21}, {8, 3, 7, 7}, 2, 3, true, true},
                                         {{2, 3, 16, 16}, {8, 3, 7, 7}, 2, 3, false, true},
                                         // ... whose column matrix, 147 x 4,225 floats a sample, goes in
                                         // bands of output rows: 19 and then 8 forward, 12 and then 5
                                         // backward
                                         {{2, 3, 130, 130}, {64, 3, 7, 7}, 2, 3, false, true},
                                         // the split past the first chunk (one sample a chunk here), an
                                         // even kernel width, a 1x7 kernel, and a kernel wider than rows
                                         // of 2 (halves of one float)
                                         {{2, 3, 48, 64}, {64, 3, 7, 7}, 2, 3, true, false},
                                         {{2, 3, 9, 10}, {8, 3, 4, 4}, 2, 1, false, true},
                                         {{2, 3, 9, 10}, {8, 3, 1, 7}, 2, 2, true, true},
                                         {{2, 3, 5, 2}, {4, 3, 5, 5}, 2, 2, false, true},
                                         // Winograd's F(2x2, 3x3) and F(4x4, 3x3) (the 3x3/1 rows over
                                         // 8x8, and with F4 4x4, and more above take them too): tiles
                                         // reaching past the plane, channel tails, the smallest planes
                                         // and channel counts they take, groups of 3 and 2 samples, and
                                         // a sample's tiles in bands of rows (F2 with both gradients: 10
                                         // and 2 of 12; F4 with both: 10 and 3 of 13)
                                         {{2, 24, 9, 12}, {20, 24, 3, 3}, 1, 1, true, true},
                                         {{3, 16, 8, 8}, {16, 16, 3, 3}, 1, 1, false, false},
                                         {{3, 16, 5, 6}, {20, 16, 3, 3}, 1, 1, false, true},
                                         {{5, 64, 12, 12}, {64, 64, 3, 3}, 1, 1, false, true},
                                         {{2, 64, 24, 24}, {64, 64, 3, 3}, 1, 1, true, true},
                                         {{1, 16, 52, 48}, {16, 16, 3, 3}, 1, 1, true, true}}) {
    const std::string shapes = "x " + str(v.x) + ", w " + str(v.w) + ", stride " + std::to_string(v.stride) +
                               ", pad " + std::to_string(v.padding) + (v.relu ? ", fused relu" : "") +
                               (v.bias ? ", bias" : ", no bias");
    std::vector<Input> inputs = {in(v.x), in(v.w)};
    if (v.bias) inputs.push_back(in({v.w[0]}));
    out.push_back({"conv2d", shapes, inputs,
                   [v](const std::vector<Tensor>& t) {
                     return ops::conv2d(t[0], t[1], v.bias ? t[2] : Tensor(), {v.stride, v.padding, v.relu});
                   },
                   kGemm});
  }
  // conv2d -> ReLU -> maxpool2d fused: the MNIST CNN's two layers, a batch that spans several of the
  // CPU kernel's chunks, overlapping and padded pooling windows, a strided padded convolution
  for (const ConvPool& v : conv_pool_cases())
    out.push_back({"conv2d_relu_maxpool", v.describe(), v.inputs(),
                   [v](const std::vector<Tensor>& t) { return v.fused(t); }, kGemm});
  // maxpool2d: windows that tile, overlap (stride < kernel) and leave a remainder; ties
  // Structured bindings are captured by init-capture (`x = x`): clang 14, which compiles the
  // sanitizer build, predates capturing them by name.
  for (const auto& [shape, kernel, stride] : std::vector<std::tuple<Shape, int, int>>{
           {{1, 1, 13, 13}, 2, 2}, {{2, 3, 7, 13}, 3, 2}, {{2, 2, 9, 9}, 2, 1}, {{4, 32, 26, 26}, 2, 2}}) {
    out.push_back({"maxpool2d",
                   str(shape) + ", kernel " + std::to_string(kernel) + ", stride " + std::to_string(stride),
                   {in(shape, Fill::kDistinct)},
                   [kernel = kernel, stride = stride](const std::vector<Tensor>& t) {
                     return ops::maxpool2d(t[0], kernel, stride);
                   },
                   kExact});
  }
  out.push_back({"maxpool2d",
                 "[2, 3, 9, 9], kernel 3, stride 2, ties",
                 {in({2, 3, 9, 9}, Fill::kTies)},
                 [](const std::vector<Tensor>& t) { return ops::maxpool2d(t[0], 3, 2); },
                 kExact});
  // maxpool2d with padding (ResNet's stem: 3x3, stride 2, padding 1)
  out.push_back({"maxpool2d",
                 "[2, 3, 13, 12], kernel 3, stride 2, pad 1",
                 {in({2, 3, 13, 12}, Fill::kDistinct)},
                 [](const std::vector<Tensor>& t) { return ops::maxpool2d(t[0], 3, 2, 1); },
                 kExact});
  out.push_back({"maxpool2d",
                 "[2, 3, 13, 12], kernel 3, stride 2, pad 1, ties",
                 {in({2, 3, 13, 12}, Fill::kTies)},
                 [](const std::vector<Tensor>& t) { return ops::maxpool2d(t[0], 3, 2, 1); },
                 kExact});
  // the same over planes of even width, which the CPU pools in whole rows: an even and an odd
  // height, one and two windows a row
  for (const Shape& shape : std::vector<Shape>{{2, 3, 8, 10}, {2, 2, 7, 4}, {1, 2, 5, 2}})
    out.push_back({"maxpool2d",
                   str(shape) + ", kernel 3, stride 2, pad 1, ties",
                   {in(shape, Fill::kTies)},
                   [](const std::vector<Tensor>& t) { return ops::maxpool2d(t[0], 3, 2, 1); },
                   kExact});
  out.push_back({"maxpool2d",
                 "[1, 2, 6, 6], kernel 2, stride 1, pad 1, ties",
                 {in({1, 2, 6, 6}, Fill::kTies)},
                 [](const std::vector<Tensor>& t) { return ops::maxpool2d(t[0], 2, 1, 1); },
                 kExact});
  // batch_norm: x, weight, bias differentiable; running statistics as constants, compared after
  // the two passes (training moves them, evaluation only reads them). [8, 33, 32, 32] is above the
  // size where the CPU's training backward takes a channel at a time.
  for (const auto& [shape, training] : std::vector<std::pair<Shape, bool>>{{{4, 3, 5, 7}, true},
                                                                           {{16, 64, 8, 8}, true},
                                                                           {{8, 33, 32, 32}, true},
                                                                           {{13, 7}, true},
                                                                           {{4, 3, 5, 7}, false}}) {
    const int64_t c = shape[1];
    out.push_back(
        {"batch_norm",
         str(shape) + (training ? ", training" : ", evaluation"),
         {in(shape), in({c}, Fill::kPositive), in({c}), constant({c}), constant({c}, Fill::kPositive)},
         [training = training](const std::vector<Tensor>& t) {
           return ops::batch_norm(t[0], t[1], t[2], t[3], t[4], {.training = training});
         },
         kGemm});
  }
  // batch_norm with its epilogue, relu(bn(x) + residual) (ResNet blocks' tails), residual differentiable
  for (const auto& [shape, training] : std::vector<std::pair<Shape, bool>>{
           {{4, 3, 5, 7}, true}, {{8, 64, 7, 7}, true}, {{4, 17, 66, 66}, true}, {{4, 3, 5, 7}, false}})
    for (const bool residual : {false, true}) {
      const int64_t c = shape[1];
      std::vector<Input> inputs = {in(shape), in({c}, Fill::kPositive), in({c}), constant({c}),
                                   constant({c}, Fill::kPositive)};
      if (residual) inputs.push_back(in(shape));
      out.push_back(
          {"batch_norm_relu",
           str(shape) + (residual ? " + residual" : "") + (training ? ", training" : ", evaluation"), inputs,
           [training = training, residual = residual](const std::vector<Tensor>& t) {
             return ops::batch_norm(
                 t[0], t[1], t[2], t[3], t[4],
                 {.training = training, .residual = residual ? t[5] : Tensor(), .relu = true});
           },
           kGemm});
    }
  for (const Shape& shape : std::vector<Shape>{{2, 3, 7, 13}, {32, 512, 7, 7}})
    out.push_back({"global_avgpool",
                   str(shape),
                   {in(shape)},
                   [](const std::vector<Tensor>& t) { return ops::global_avgpool(t[0]); },
                   kPointwise});
  out.push_back({"add",
                 str(kLarge) + " + " + str(kLarge),
                 {in(kLarge), in(kLarge)},
                 [](const std::vector<Tensor>& t) { return ops::add(t[0], t[1]); },
                 kExact});
  // pointwise
  for (const auto& [f, name, tolerance] : std::vector<std::tuple<Activation, const char*, double>>{
           {Activation::kRelu, "relu", kExact},
           {Activation::kTanh, "tanh", kPointwise},
           {Activation::kSigmoid, "sigmoid", kPointwise}})
    for (const Shape& shape : std::vector<Shape>{{7}, {13, 257}, kLarge})
      out.push_back({name,
                     str(shape),
                     {in(shape)},
                     [f = f](const std::vector<Tensor>& t) { return ops::activation(t[0], f); },
                     tolerance});
  out.push_back({"reshape",
                 "[7, 13, 3] -> [21, 13]",
                 {in({7, 13, 3})},
                 [](const std::vector<Tensor>& t) {
                   return ops::reshape(t[0], {21, 13});
                 },
                 kExact});
  out.push_back({"flatten",
                 "[2, 3, 7, 13]",
                 {in({2, 3, 7, 13})},
                 [](const std::vector<Tensor>& t) { return ops::flatten(t[0]); },
                 kExact});
  for (const auto& [shape, p] :
       std::vector<std::pair<Shape, float>>{{{13, 257}, 0.5f}, {kLarge, 0.2f}, {{1}, 0.9f}})
    out.push_back({"dropout",
                   str(shape) + ", p " + std::to_string(p).substr(0, 3),
                   {in(shape)},
                   [p = p](const std::vector<Tensor>& t) {
                     Rng rng(1234);  // the same stream on every backend and pass
                     return ops::dropout(t[0], p, rng);
                   },
                   kExact});
  // losses and reductions
  for (const auto& [batch, classes] : std::vector<std::pair<int64_t, int64_t>>{{1, 10}, {7, 13}, {128, 10}}) {
    std::vector<int32_t> labels;
    Rng rng(99);
    for (int64_t b = 0; b < batch; ++b) labels.push_back(static_cast<int32_t>(rng.below(classes)));
    out.push_back({"cross_entropy",
                   "logits " + str({batch, classes}),
                   {in({batch, classes})},
                   [labels](const std::vector<Tensor>& t) { return ops::cross_entropy(t[0], labels); },
                   kPointwise});
  }
  for (const Shape& shape : std::vector<Shape>{{1, 1}, {7, 13}})
    out.push_back({"mse",
                   str(shape),
                   {in(shape), constant(shape, Fill::kPositive)},
                   [](const std::vector<Tensor>& t) { return ops::mse(t[0], t[1]); },
                   kPointwise});
  for (const Shape& shape : std::vector<Shape>{{257}, kLarge})
    out.push_back({"sum",
                   str(shape),
                   {in(shape)},
                   [](const std::vector<Tensor>& t) { return ops::sum(t[0]); },
                   kPointwise});
  return out;
}

class Ops : public ::testing::TestWithParam<Case> {};

TEST_P(Ops, MatchTheReference) {
  check(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Table, Ops, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string name = std::to_string(info.index) + "_" + info.param.op;
  return name;
});

// The fused op is the three ops it replaces, bit for bit, on the host backends (the reference's is
// the default composition, the CPU's its own chunked kernel): outputs and each input's gradient,
// also with Inf in the upstream gradient (dropped where ReLU's mask is 0, as the separate kernels
// drop it). On a GPU cuDNN may pick algorithms that add in a varying order: there, within kGemm, and
// with Inf upstream the same elements non-finite.
TEST(Fused, ConvReluMaxpoolIsItsPartsBitwise) {
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  const auto infinities = [](std::vector<float>& upstream) {
    for (std::size_t i = 0; i < upstream.size(); i += 7) upstream[i] = i % 2 ? INFINITY : -INFINITY;
  };
  for (const Device device : devices)
    for (const ConvPool& v : conv_pool_cases())
      for (const bool poisoned : {false, true}) {
        const bool gpu = device.type == DeviceType::kCuda;
        const auto poison = poisoned ? std::function<void(std::vector<float>&)>(infinities) : nullptr;
        const Outcome fused =
            run_case({"fused", v.describe(), v.inputs(), [v](const auto& t) { return v.fused(t); }, 0},
                     device, poison);
        const Outcome parts =
            run_case({"parts", v.describe(), v.inputs(), [v](const auto& t) { return v.parts(t); }, 0},
                     device, poison);
        const double tolerance = gpu ? kGemm : kExact;
        const auto agree = [&](const std::vector<float>& a, const std::vector<float>& b) {
          return gpu && poisoned ? within_where_finite(a, b, tolerance) : within(a, b, tolerance);
        };
        const std::string what = device.str() + " " + v.describe() + (poisoned ? ", Inf upstream" : "");
        EXPECT_TRUE(agree(fused.output, parts.output)) << what << ": output";
        ASSERT_EQ(fused.gradients_twice.size(), parts.gradients_twice.size());
        for (std::size_t k = 0; k < fused.gradients_twice.size(); ++k)
          EXPECT_TRUE(agree(fused.gradients_twice[k], parts.gradients_twice[k]))
              << what << ": gradient of input " << k << " differs by "
              << error_of(fused.gradients_twice[k], parts.gradients_twice[k]);
      }
}

// BatchNorm's epilogue is batch_norm, add and relu as separate ops, bit for bit, on every backend:
// outputs and each input's gradient, with and without the residual, in training and evaluation,
// and with Inf in the upstream gradient (NaN behind an inactive unit, as ReLU's backward makes it).
TEST(Fused, BatchNormAddReluIsItsPartsBitwise) {
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  const auto infinities = [](std::vector<float>& upstream) {
    for (std::size_t i = 0; i < upstream.size(); i += 7) upstream[i] = i % 2 ? INFINITY : -INFINITY;
  };
  for (const Device device : devices)
    for (const Shape& shape : std::vector<Shape>{{4, 3, 5, 7}, {8, 64, 7, 7}, {2, 16, 28, 28}})
      for (const bool training : {true, false})
        for (const bool residual : {false, true})
          for (const bool poisoned : {false, true}) {
            const int64_t c = shape[1];
            std::vector<Input> inputs = {in(shape), in({c}, Fill::kPositive), in({c}), constant({c}),
                                         constant({c}, Fill::kPositive)};
            if (residual) inputs.push_back(in(shape));
            const ops::BatchNormOptions plain{.training = training};
            const auto fused = [&](const std::vector<Tensor>& t) {
              ops::BatchNormOptions o = plain;
              o.residual = residual ? t[5] : Tensor();
              o.relu = true;
              return ops::batch_norm(t[0], t[1], t[2], t[3], t[4], o);
            };
            const auto parts = [&](const std::vector<Tensor>& t) {
              const Tensor normalized = ops::batch_norm(t[0], t[1], t[2], t[3], t[4], plain);
              return ops::relu(residual ? ops::add(normalized, t[5]) : normalized);
            };
            const auto poison = poisoned ? std::function<void(std::vector<float>&)>(infinities) : nullptr;
            const Outcome a = run_case({"fused", str(shape), inputs, fused, 0}, device, poison);
            const Outcome b = run_case({"parts", str(shape), inputs, parts, 0}, device, poison);
            const std::string what = device.str() + " " + str(shape) +
                                     (training ? " training" : " evaluation") +
                                     (residual ? " + residual" : "") + (poisoned ? ", Inf upstream" : "");
            EXPECT_TRUE(within(a.output, b.output, kExact)) << what << ": output";
            ASSERT_EQ(a.gradients_twice.size(), b.gradients_twice.size());
            for (std::size_t k = 0; k < a.gradients_twice.size(); ++k)
              EXPECT_TRUE(within(a.gradients_twice[k], b.gradients_twice[k], kExact))
                  << what << ": gradient of input " << k << " differs by "
                  << error_of(a.gradients_twice[k], b.gradients_twice[k]);
            EXPECT_TRUE(within(a.constants_after[0], b.constants_after[0], kExact))
                << what << ": running mean";
          }
}

// Training's BatchNorm kernels as one call per direction (what the CPU backend runs a channel at a
// time) give the results of the separate kernels, which SyncBatchNorm runs and which Backend's
// defaults call in turn, bit for bit: output, statistics, running statistics and every gradient, with
// each epilogue, below and above the size where the CPU's backward takes a channel at a time (and
// streams what it writes: planes of one piece, of two with a ragged second, and planes off the
// packets' alignment, which it writes as it lies). The first
// backward writes the one call's gradients over NaN and adds the separate kernels' into zeros; the
// second adds into what the first left, on both sides.
TEST(Fused, BatchNormTrainingKernelsAreTheSeparateOnesBitwise) {
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  for (const Device device : devices)
    for (const BatchNormShape s :
         {BatchNormShape{4, 3, 35}, BatchNormShape{3, 5, 1}, BatchNormShape{8, 33, 1024},
          BatchNormShape{4, 40, 1648}, BatchNormShape{2, 67, 1960}})
      for (const bool residual : {false, true})
        for (const bool relu : {false, true}) {
          Backend& backend = backend_for(device);
          const Shape shape{s.batch, s.channels, s.inner}, channels{s.channels};
          const auto values = [](const Shape& sh, uint64_t seed, Fill fill = Fill::kUniform) {
            return host_values({sh, fill, false}, seed);
          };
          const auto run = [&](bool one_call) {
            const auto on = [&](const Shape& sh, const std::vector<float>& v) {
              return Tensor::from_data(sh, v).to(device);
            };
            const Tensor x = on(shape, values(shape, 1)), gy = on(shape, values(shape, 2));
            const Tensor shortcut = on(shape, values(shape, 3)),
                         gamma = on(channels, values(channels, 4, Fill::kPositive));
            const Tensor beta = on(channels, values(channels, 5)),
                         running_mean = on(channels, values(channels, 6));
            const Tensor running_var = on(channels, values(channels, 7, Fill::kPositive));
            const Tensor y = Tensor::empty(shape, device), stats = Tensor::empty({2 * s.channels}, device);
            const Tensor ggamma = Tensor::zeros(channels, device), gbeta = Tensor::zeros(channels, device);
            const float first = one_call ? NAN : 0.0f;
            const Tensor gx = Tensor::full(shape, first).to(device);
            const Tensor gresidual = Tensor::full(shape, residual ? first : 0.0f).to(device);
            const StoragePtr sums = make_storage(sizeof(double) * (s.channels + 1), device);
            const StoragePtr squares = make_storage(sizeof(double) * s.channels, device);
            const StoragePtr grad_sums = make_storage(sizeof(double) * 2 * s.channels, device);
            const BatchNormEpilogue epilogue{.residual = residual ? shortcut.data_ptr() : nullptr,
                                             .relu = relu};
            if (one_call)
              backend.batchnorm_train_forward(x.data_ptr(), gamma.data_ptr(), beta.data_ptr(),
                                              sums->as<double>(), squares->as<double>(), stats.data_ptr(),
                                              running_mean.data_ptr(), running_var.data_ptr(), y.data_ptr(),
                                              s, epilogue, 1e-5f, 0.1f);
            else
              backend.Backend::batchnorm_train_forward(
                  x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), sums->as<double>(), squares->as<double>(),
                  stats.data_ptr(), running_mean.data_ptr(), running_var.data_ptr(), y.data_ptr(), s,
                  epilogue, 1e-5f, 0.1f);
            for (int pass = 0; pass < 2; ++pass) {
              const bool write = one_call && pass == 0;
              const GradientOut to_residual =
                  residual ? GradientOut(gresidual.data_ptr(), write) : GradientOut();
              const GradientOut to_x(gx.data_ptr(), write);
              const float* relu_y = relu ? y.data_ptr() : nullptr;
              if (one_call)
                backend.batchnorm_train_backward(gy.data_ptr(), relu_y, x.data_ptr(), stats.data_ptr(),
                                                 gamma.data_ptr(), sums->as<double>(),
                                                 grad_sums->as<double>(), ggamma.data_ptr(), gbeta.data_ptr(),
                                                 to_residual, to_x, s);
              else
                backend.Backend::batchnorm_train_backward(
                    gy.data_ptr(), relu_y, x.data_ptr(), stats.data_ptr(), gamma.data_ptr(),
                    sums->as<double>(), grad_sums->as<double>(), ggamma.data_ptr(), gbeta.data_ptr(),
                    to_residual, to_x, s);
            }
            // Everything as doubles (floats convert exactly), compared byte for byte.
            std::vector<std::vector<double>> out;
            for (const Tensor& t : {y, stats, running_mean, running_var, ggamma, gbeta, gresidual, gx}) {
              const std::vector<float> v = t.to_vector();
              out.emplace_back(v.begin(), v.end());
            }
            for (const auto& [storage, n] : {std::pair{sums, s.channels + 1}, std::pair{squares, s.channels},
                                             std::pair{grad_sums, 2 * s.channels}}) {
              out.emplace_back(static_cast<std::size_t>(n));
              backend.copy_to_host(out.back().data(), storage->data(), sizeof(double) * out.back().size());
            }
            return out;
          };
          const std::vector<std::vector<double>> one_call = run(true), separate = run(false);
          static const char* const names[] = {"y",
                                              "stats",
                                              "running mean",
                                              "running variance",
                                              "gamma's gradient",
                                              "beta's gradient",
                                              "residual's gradient",
                                              "x's gradient",
                                              "sums",
                                              "squares",
                                              "gradient sums"};
          const std::string what = device.str() + " [" + std::to_string(s.batch) + ", " +
                                   std::to_string(s.channels) + ", " + std::to_string(s.inner) + "]" +
                                   (residual ? " + residual" : "") + (relu ? ", ReLU" : "");
          ASSERT_EQ(one_call.size(), std::size(names));
          for (std::size_t k = 0; k < one_call.size(); ++k) {
            const bool same =
                one_call[k].size() == separate[k].size() &&
                std::memcmp(one_call[k].data(), separate[k].data(), sizeof(double) * one_call[k].size()) == 0;
            EXPECT_TRUE(same) << what << ": " << names[k] << " differs";
          }
          for (const std::size_t written : {std::size_t{6}, std::size_t{7}}) {  // no NaN of the buffer left
            const std::vector<double>& v = one_call[written];
            EXPECT_TRUE(std::none_of(v.begin(), v.end(), [](double e) { return std::isnan(e); }))
                << what << ": " << names[written] << " was added into, not written";
          }
        }
}

// ---- gradients written rather than added into (GradientOut::overwrite) ----

// A gradient that a kernel is asked to write comes out as adding into zeros does, whatever the
// buffer held (here NaN, which any read of it spreads): every convolution path of the CPU backend
// (the direct kernels, im2col, one-sample chunks in place, per-tap GEMMs, the fused ReLU, the fused ReLU and
// max pooling) and BatchNorm's input and residual gradients, in training and evaluation. Bitwise on the host
// backends; on a GPU within kGemm, since cuDNN may take another code path for beta 0.
TEST(Gradients, WrittenOnesIgnoreWhatTheBufferHeld) {
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  uint64_t seed = 500;
  const auto on = [&](Device device, const Shape& shape) {
    return Tensor::from_data(shape, host_values({shape, Fill::kUniform, true}, ++seed)).to(device);
  };
  const auto doubles = [](Device device, const std::vector<double>& values) {
    StoragePtr s = make_storage(sizeof(double) * values.size(), device);
    backend_for(device).copy_from_host(s->data(), values.data(), sizeof(double) * values.size());
    return s;
  };
  // The kernel run twice: adding into zeros, then writing over NaN.
  const auto check_written = [](Device device, const std::string& what, int64_t n,
                                const std::function<void(GradientOut)>& kernel) {
    const Tensor added = Tensor::zeros({n}, device), written = Tensor::full({n}, NAN).to(device);
    kernel({added.data_ptr(), false});
    kernel({written.data_ptr(), true});
    const std::vector<float> a = added.to_vector(), w = written.to_vector();
    const bool gpu = device.type == DeviceType::kCuda;
    EXPECT_TRUE(gpu ? within(w, a, kGemm) : bitwise_equal(w, a))
        << device.str() << " " << what << ": written differs from added into zeros by " << error_of(w, a);
    EXPECT_GT(error_of(a, std::vector<float>(a.size(), 0.0f)), 0) << device.str() << " " << what;
  };
  // batch, channels, height, width, out_channels, kernel_h, kernel_w, out_h, out_w, stride, padding, relu
  const std::vector<std::pair<std::string, Conv2dGeometry>> convolutions = {
      {"conv 3x3/1, direct", {2, 3, 9, 9, 4, 3, 3, 9, 9, 1, 1, false}},
      {"conv 3x3/1, direct, ReLU", {2, 3, 9, 9, 4, 3, 3, 9, 9, 1, 1, true}},
      {"conv 3x3/2, im2col", {2, 8, 9, 9, 5, 3, 3, 4, 4, 2, 0, false}},
      {"conv 1x1/1, one sample in place", {1, 48, 5, 5, 8, 1, 1, 5, 5, 1, 0, false}},
      // written by the GEMM itself, sample after sample, the second block of its depth (200 outputs)
      // adding into the first
      {"conv 1x1/1, in place, written by its GEMM", {2, 64, 32, 32, 200, 1, 1, 32, 32, 1, 0, false}},
      {"conv 1x1/1, a chunk of three samples", {3, 16, 4, 4, 8, 1, 1, 4, 4, 1, 0, false}},
      {"conv 3x3/1 over 2x2, per-tap GEMMs", {3, 16, 2, 2, 24, 3, 3, 2, 2, 1, 1, true}},
      {"conv 3x3/2 to 4x4, per-tap GEMMs", {2, 16, 8, 8, 24, 3, 3, 4, 4, 2, 1, false}},
      // every other row and column of the input is read by no tap: its gradient is 0, not left as found
      {"conv 1x1/2, inputs no tap reads", {2, 4, 8, 8, 4, 1, 1, 4, 4, 2, 0, false}},
  };
  for (const Device device : devices) {
    Backend& backend = backend_for(device);
    for (const auto& [what, geometry] : convolutions) {
      const Conv2dGeometry g = geometry;  // a lambda may not capture a structured binding (clang 14)
      const Tensor x = on(device, {g.batch, g.channels, g.height, g.width});
      const Tensor w = on(device, {g.out_channels, g.channels, g.kernel_h, g.kernel_w});
      const Tensor y = on(device, {g.batch, g.out_channels, g.out_h, g.out_w});
      const Tensor gy = on(device, y.shape());
      check_written(device, what, x.numel(), [&](GradientOut gx) {
        backend.conv2d_backward(gy.data_ptr(), x.data_ptr(), w.data_ptr(), y.data_ptr(), gx, nullptr, nullptr,
                                g);
      });
    }
    // conv -> ReLU -> max pooling 2/2, fused: its backward's input gradient. Over 7x7 no window
    // reaches the conv output's last row and column, whose gradient must be 0 in what the conv reads.
    for (const int64_t side : {8, 7}) {
      const int64_t pooled_side = side / 2;
      const ConvPoolGeometry pooling{{2, 3, side, side, 4, 3, 3, side, side, 1, 1, true},
                                     {2 * 4, side, side, pooled_side, pooled_side, 2, 2, 0}};
      const Tensor pool_x = on(device, {2, 3, side, side}), pool_w = on(device, {4, 3, 3, 3});
      const Shape pooled_shape{2, 4, pooled_side, pooled_side};
      const Tensor pooled = Tensor::empty(pooled_shape, device), pool_gy = on(device, pooled_shape);
      const StoragePtr argmax = make_storage(sizeof(int32_t) * pooled.numel(), device);
      backend.conv2d_relu_maxpool(pool_x.data_ptr(), pool_w.data_ptr(), nullptr, pooled.data_ptr(),
                                  argmax->as<int32_t>(), pooling);
      check_written(
          device,
          "conv 3x3/1 + ReLU + max-pool 2/2 over " + std::to_string(side) + "x" + std::to_string(side),
          pool_x.numel(), [&](GradientOut gx) {
            backend.conv2d_relu_maxpool_backward(pool_gy.data_ptr(), argmax->as<int32_t>(), pooled.data_ptr(),
                                                 pool_x.data_ptr(), pool_w.data_ptr(), gx, nullptr, nullptr,
                                                 pooling);
          });
    }
    const BatchNormShape s{4, 3, 35};
    const Tensor x = on(device, {4, 3, 5, 7}), gy = on(device, x.shape()), relu_y = on(device, x.shape());
    const Tensor gamma = on(device, {3});
    const Tensor stats =
        Tensor::from_data({6}, std::vector<float>{0.1f, -0.2f, 0.3f, 1.5f, 0.8f, 2.0f}).to(device);
    const StoragePtr sums = doubles(device, {1.0, -2.0, 3.0, 140.0});
    const StoragePtr grad_sums = doubles(device, {0.5, -1.5, 2.5, 0.25, -0.75, 1.0});
    const StoragePtr scratch = doubles(device, std::vector<double>(6));
    for (const bool relu : {false, true}) {
      const float* mask = relu ? relu_y.data_ptr() : nullptr;
      const std::string epilogue = relu ? ", ReLU" : "";
      for (const bool training : {true, false})
        check_written(device, "batchnorm input" + epilogue + (training ? ", training" : ", evaluation"),
                      x.numel(), [&](GradientOut gx) {
                        backend.batchnorm_backward_input(gy.data_ptr(), mask, x.data_ptr(), stats.data_ptr(),
                                                         gamma.data_ptr(),
                                                         training ? grad_sums->as<double>() : nullptr,
                                                         training ? sums->as<double>() : nullptr, gx, s);
                      });
      check_written(device, "batchnorm residual" + epilogue, x.numel(), [&](GradientOut gresidual) {
        backend.batchnorm_backward_reduce(gy.data_ptr(), mask, x.data_ptr(), stats.data_ptr(),
                                          scratch->as<double>(), nullptr, nullptr, gresidual, s);
      });
    }
  }
}

// Through the ops: a tensor's first gradient buffer is not zeroed but written by the first kernel
// to contribute (the host cache hands the convolution's input gradient a block that was left full of
// NaN), and the second pass adds into it. The host backends, where the cache's reuse is known.
TEST(Gradients, AFreshBufferIsWrittenByItsFirstContribution) {
  for (const Device device : {Device::cpu(), Device::reference()}) {
    autograd::clear_tape();
    const Shape shape{1, 48, 5, 5};  // the only tensors of 1200 floats below: x and its gradient
    const Tensor x = Tensor::from_data(shape, host_values({shape, Fill::kUniform, true}, 11)).to(device);
    const Tensor w = Tensor::from_data({8, 48, 1, 1}, host_values({{8, 48, 1, 1}, Fill::kUniform, true}, 12));
    x.set_requires_grad(true);
    std::vector<float> passes[2];
    for (std::vector<float>& gradient : passes) {
      {
        const Tensor left_over = Tensor::full(shape, NAN).to(device);
        ASSERT_FALSE(left_over.same_as(x));
      }
      const Tensor y = ops::conv2d(x, w.to(device), Tensor(), {1, 0, false});
      autograd::backward(y, Tensor::full(y.shape(), 1.0f).to(device));
      gradient.resize(static_cast<std::size_t>(x.numel()));
      backend_for(device).copy_to_host(gradient.data(), x.grad_ptr(), gradient.size() * sizeof(float));
    }
    // d(sum y)/dx[c] = sum over the output channels of w[o, c], at every pixel.
    const std::vector<float> weights = w.to_vector();
    for (int64_t c = 0; c < 48; ++c) {
      double expected = 0;
      for (int64_t o = 0; o < 8; ++o) expected += weights[static_cast<std::size_t>(o * 48 + c)];
      for (int64_t p = 0; p < 25; ++p) {
        const std::size_t at = static_cast<std::size_t>(c * 25 + p);
        EXPECT_NEAR(passes[0][at], expected, 1e-5) << device.str() << " first pass, element " << at;
        EXPECT_NEAR(passes[1][at], 2 * expected, 2e-5) << device.str() << " second pass, element " << at;
      }
    }
  }
}

// Max pooling lets NaN win (torch.max_pool2d does) on every backend, inside the plane and on its
// padded border, and sends the gradient where the reference does: the last NaN of a window in
// row-major order, else the first maximum. Planes of even width (the CPU's passes over whole rows)
// and odd width (its scan per window).
class MaxPool : public ::testing::TestWithParam<int64_t> {};
TEST_P(MaxPool, NanWinsOnEveryBackend) {
  const int64_t width = GetParam();
  std::vector<float> values(static_cast<std::size_t>(2 * 9 * width));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  for (const std::size_t at : {0, 23, 25, 44, 61, 89, 90 + 45}) values[at] = NAN;
  const auto run = [&](Device device) {
    const Tensor x = Tensor::from_data({1, 2, 9, width}, values).to(device);
    x.set_requires_grad(true);
    const Tensor y = ops::maxpool2d(x, 3, 2, 1);
    autograd::backward(y, Tensor::full(y.shape(), 1.0f).to(device));
    std::vector<float> gx(values.size());
    backend_for(device).copy_to_host(gx.data(), x.grad_ptr(), gx.size() * sizeof(float));
    return std::pair{y.to(Device::cpu()).to_vector(), gx};
  };
  const auto [reference_y, reference_gx] = run(Device::reference());
  for (const Device device : devices_under_test()) {
    const auto [y, gx] = run(device);
    ASSERT_EQ(y.size(), reference_y.size());
    for (std::size_t i = 0; i < y.size(); ++i)
      EXPECT_TRUE(std::isnan(reference_y[i]) ? std::isnan(y[i]) : y[i] == reference_y[i])
          << device.str() << ": output " << i << " is " << y[i] << ", the reference's " << reference_y[i];
    EXPECT_EQ(gx, reference_gx) << device.str() << ": the gradient went to other positions";
  }
}
INSTANTIATE_TEST_SUITE_P(Widths, MaxPool, ::testing::Values(10, 11));

// ReLU keeps NaN on every backend, standalone and as a convolution's epilogue (torch.relu does): a
// diverging run must reach the finiteness check, not be clipped to 0 on one device only.
TEST(Relu, NanPassesThroughOnEveryBackend) {
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  const std::vector<float> values = {NAN, -1.0f, 2.0f, -0.0f, INFINITY, -INFINITY};
  const std::vector<float> expected = {NAN, 0.0f, 2.0f, 0.0f, INFINITY, 0.0f};
  const auto n = static_cast<int64_t>(values.size());
  for (const Device device : devices) {
    const Tensor x = Tensor::from_data({1, 1, 1, n}, values).to(device);
    const Tensor one = Tensor::from_data({1, 1, 1, 1}, std::vector<float>{1.0f}).to(device);
    const Tensor zero = Tensor::from_data({1}, std::vector<float>{0.0f}).to(device);
    Tensor activated = Tensor::zeros({1, 1, 1, n}, device), convolved = Tensor::zeros({1, 1, 1, n}, device);
    Backend& backend = backend_for(device);
    backend.activation(Activation::kRelu, x.data_ptr(), activated.data_ptr(), n);
    // A 1x1 convolution with weight 1 and bias 0, ReLU fused: the identity, then the epilogue.
    const Conv2dGeometry g{1, 1, 1, n, 1, 1, 1, 1, n, 1, 0, /*fuse_relu=*/true};
    backend.conv2d(x.data_ptr(), one.data_ptr(), zero.data_ptr(), convolved.data_ptr(), g);
    // NaN payloads may differ (a GPU's arithmetic makes the canonical NaN): NaN must stay NaN.
    const auto same = [&](const Tensor& t) {
      const std::vector<float> got = t.to(Device::cpu()).to_vector();
      for (std::size_t i = 0; i < got.size(); ++i)
        if (std::isnan(expected[i]) ? !std::isnan(got[i]) : !bitwise_equal({&got[i], 1}, {&expected[i], 1}))
          return false;
      return true;
    };
    EXPECT_TRUE(same(activated)) << device.str() << ": activation";
    EXPECT_TRUE(same(convolved)) << device.str() << ": conv2d epilogue";
  }
}

// ---- casts and the finiteness check: bitwise ----

TEST(Casts, HalfConversionsMatchTheReferenceBitwise) {
  // Rounding boundaries, overflow, Inf/NaN/-0, subnormals and ties, then random values.
  std::vector<float> values = {0.0f,          -0.0f,          1.0f,           -1.0f,    65504.0f,
                               65520.0f,      70000.0f,       -1e9f,          INFINITY, -INFINITY,
                               NAN,           5.96e-8f,       2.98e-8f,       8.94e-8f, 6.1e-5f,
                               1.0009765625f, 1.00048828125f, 1.00146484375f, 3.4e38f,  1e-40f};
  Rng rng(5);
  for (int i = 0; i < 3000; ++i)
    values.push_back(std::ldexp(rng.uniform(-1.0f, 1.0f), static_cast<int>(rng.below(60)) - 40));
  const int64_t n = static_cast<int64_t>(values.size());
  for (const Device device : devices_under_test())
    for (HalfFormat format : {HalfFormat::kFp16, HalfFormat::kBf16})
      for (float scale : {1.0f, 0.5f}) {
        const auto convert = [&](Device d) {
          Backend& b = backend_for(d);
          const Tensor x = Tensor::from_data({n}, values).to(d);
          StoragePtr halves = make_storage(sizeof(uint16_t) * n, d);
          b.to_half(x.data_ptr(), halves->as<uint16_t>(), n, scale, format);
          const Tensor back = Tensor::empty({n}, d);
          b.from_half(halves->as<uint16_t>(), back.data_ptr(), n, format);
          std::vector<uint16_t> h(n);
          b.copy_to_host(h.data(), halves->data(), h.size() * sizeof(uint16_t));
          return std::make_pair(h, back.to_vector());
        };
        const auto [expected_halves, expected_back] = convert(Device::reference());
        const auto [halves, back] = convert(device);
        const std::string what = device.str() + (format == HalfFormat::kFp16 ? " fp16" : " bf16") +
                                 " scale " + std::to_string(scale);
        EXPECT_EQ(halves, expected_halves) << what;
        EXPECT_TRUE(bitwise_equal(back, expected_back)) << what;
        rows().push_back({format == HalfFormat::kFp16 ? "to/from fp16" : "to/from bf16",
                          std::to_string(n) + " values, scale " + std::to_string(scale).substr(0, 3),
                          device.str(),
                          0,
                          {},
                          kExact,
                          halves == expected_halves && bitwise_equal(back, expected_back)});
      }
}

// fill at four alignments within a packet, at sizes below and above the 2^18 floats from which the CPU
// streams its stores: every element of the range takes the value, the floats on either side keep
// theirs.
TEST(Fills, SetTheirRangeAndNothingElseAtAnyAlignment) {
  constexpr int64_t kMargin = 32;
  for (const Device device : devices_under_test())
    for (const int64_t n : {int64_t{1000}, (int64_t{1} << 18) + 21})
      for (const int64_t offset : {0, 1, 5, 15}) {
        const Tensor x = Tensor::from_data({n + kMargin}, std::vector<float>(n + kMargin, -1.0f)).to(device);
        backend_for(device).fill(x.data_ptr() + offset, n, 2.5f);
        const std::vector<float> got = x.to_vector();
        int64_t wrong = 0;
        for (int64_t i = 0; i < n + kMargin; ++i)
          wrong += got[i] != (i >= offset && i < offset + n ? 2.5f : -1.0f);
        EXPECT_EQ(wrong, 0) << device.str() << ": " << n << " floats from " << offset;
      }
}

TEST(Casts, AllFiniteAgreesWithTheReference) {
  for (const Device device : devices_under_test())
    for (float poison : {0.0f, NAN, INFINITY, -INFINITY}) {
      std::vector<float> values(100003, 0.25f);
      values[77777] = poison;
      const Tensor x = Tensor::from_data({static_cast<int64_t>(values.size())}, values);
      const bool expected =
          backend_for(Device::reference()).all_finite(x.to(Device::reference()).data_ptr(), x.numel());
      EXPECT_EQ(backend_for(device).all_finite(x.to(device).data_ptr(), x.numel()), expected) << poison;
      EXPECT_EQ(expected, poison == 0.0f);
    }
}

// Gradient clipping's sum of squares within 1e-12 relative of the reference's sum in long double, one
// element after another (and on the CPU the same bits at 1, 2 and 3 threads, its order depending on n
// alone). Sizes around the CPU's blocks of 2^14.
TEST(Clipping, SumOfSquaresMatchesTheReference) {
  constexpr double kSumTolerance = 1e-12;
  for (const Device device : devices_under_test())
    for (int64_t n : {0, 1, 7, 16384, 16385, 300001}) {
      const std::vector<float> values =
          test_util::uniform_values(n, 77 + static_cast<uint64_t>(n), -3.0f, 3.0f);
      const Tensor x = Tensor::from_data({n}, values);
      const double want =
          backend_for(Device::reference()).sum_of_squares(x.to(Device::reference()).data_ptr(), n);
      const Tensor on_device = x.to(device);
      Backend& backend = backend_for(device);
      const double got = backend.sum_of_squares(on_device.data_ptr(), n);
      const double error = want == 0 ? std::abs(got) : std::abs(got - want) / want;
      EXPECT_LE(error, kSumTolerance) << device.str() << ", " << n << " elements: " << got << " vs " << want;
      if (device.is_host()) {
        for (int threads : {1, 2, 3}) {
          const int before = omp_get_max_threads();
          omp_set_num_threads(threads);
          const double again = backend.sum_of_squares(on_device.data_ptr(), n);
          omp_set_num_threads(before);
          EXPECT_EQ(std::memcmp(&again, &got, sizeof got), 0)
              << n << " elements at " << threads << " threads";
        }
      }
      rows().push_back({"sum_of_squares",
                        std::to_string(n),
                        device.str(),
                        error,
                        {},
                        kSumTolerance,
                        error <= kSumTolerance});
    }
}

// ---- the metric and flag ops a GPU runs without the host waiting: exact ----

// Correct predictions as std::max_element counts them: the first largest wins a tie, and a NaN wins
// only where it comes first.
TEST(Metrics, CountCorrectIsMaxElementsCount) {
  constexpr int64_t kRows = 37, kClasses = 10;
  std::vector<float> logits = test_util::uniform_values(kRows * kClasses, 41);
  std::vector<int32_t> labels(kRows);
  for (int64_t b = 0; b < kRows; ++b) labels[b] = static_cast<int32_t>((b * 7) % kClasses);
  logits[0 * kClasses + 3] = logits[0 * kClasses + 5] = 9.0f;  // a tie: class 3
  labels[0] = 3;
  logits[1 * kClasses + 3] = logits[1 * kClasses + 5] = 9.0f;  // the same tie, labelled elsewhere
  labels[1] = 7;
  logits[2 * kClasses + 4] = NAN;  // a NaN inside: never the largest
  logits[2 * kClasses + 6] = 9.0f;
  labels[2] = 6;
  logits[3 * kClasses + 0] = NAN;  // a NaN first: nothing compares larger
  labels[3] = 0;
  for (int64_t b = 4; b < kRows; b += 3) logits[b * kClasses + labels[b]] = 9.0f;  // some right
  int64_t expected = 0;
  for (int64_t b = 0; b < kRows; ++b) {
    const float* row = logits.data() + b * kClasses;
    expected += (std::max_element(row, row + kClasses) - row) == labels[b];
  }
  EXPECT_GE(expected, 14);
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  for (const Device device : devices) {
    const Tensor x = Tensor::from_data({kRows, kClasses}, logits).to(device);
    const Tensor out = Tensor::zeros({1}, device);
    backend_for(device).count_correct(x.data_ptr(), labels, kClasses, out.data_ptr());
    EXPECT_EQ(out.to_vector()[0], static_cast<float>(expected)) << device.str();
  }
}

// The deferred finiteness check: the first step that marks the flag stays in it, and an update
// given a set flag changes nothing.
TEST(Flags, MarkNonFiniteKeepsTheFirstMarkerAndStopsUpdates) {
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  for (const Device device : devices) {
    Backend& backend = backend_for(device);
    const StoragePtr flag = make_storage(sizeof(int32_t), device);
    const auto read_flag = [&] {
      int32_t v = -1;
      backend.copy_to_host(&v, flag->as<int32_t>(), sizeof v);
      return v;
    };
    const int32_t zero = 0;
    backend.copy_from_host(flag->as<int32_t>(), &zero, sizeof zero);
    std::vector<float> values(70001, 0.5f);
    const Tensor finite = Tensor::from_data({70001}, values).to(device);
    values[70000] = INFINITY;
    const Tensor infinite = Tensor::from_data({70001}, values).to(device);
    values[70000] = 0.5f;
    values[3] = NAN;
    const Tensor nan = Tensor::from_data({70001}, values).to(device);
    backend.mark_non_finite(finite.data_ptr(), finite.numel(), flag->as<int32_t>(), 5);
    EXPECT_EQ(read_flag(), 0) << device.str();
    backend.mark_non_finite(infinite.data_ptr(), infinite.numel(), flag->as<int32_t>(), 7);
    EXPECT_EQ(read_flag(), 7) << device.str();
    backend.mark_non_finite(nan.data_ptr(), nan.numel(), flag->as<int32_t>(), 9);
    EXPECT_EQ(read_flag(), 7) << device.str() << ": the first marker stays";

    const Tensor params = Tensor::from_data({4}, std::vector<float>{1, 2, 3, 4}).to(device);
    const Tensor grads = Tensor::from_data({4}, std::vector<float>{1, 1, 1, 1}).to(device);
    const Tensor m = Tensor::zeros({4}, device), v = Tensor::zeros({4}, device);
    backend.sgd_step(params.data_ptr(), grads.data_ptr(), nullptr, 4,
                     {.lr = 0.5f, .skip_if_set = flag->as<int32_t>()});
    AdamStep adam{.step_size = 0.1f, .skip_if_set = flag->as<int32_t>()};
    backend.adam_step(params.data_ptr(), grads.data_ptr(), m.data_ptr(), v.data_ptr(), 4, adam);
    EXPECT_EQ(params.to_vector(), (std::vector<float>{1, 2, 3, 4})) << device.str() << ": skipped";
    backend.copy_from_host(flag->as<int32_t>(), &zero, sizeof zero);
    backend.sgd_step(params.data_ptr(), grads.data_ptr(), nullptr, 4,
                     {.lr = 0.5f, .skip_if_set = flag->as<int32_t>()});
    EXPECT_EQ(params.to_vector(), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}))
        << device.str() << ": applied";
  }
}

// ---- optimizers: three steps over flat buffers, parameters and state compared ----

// The hyperparameters of one row; the optimizer is built from them, and so is the expected result,
// by PyTorch's formulas here in the test (not from optim/'s step scalars, which every backend
// receives alike: a bias-correction or first-step bug there would pass a backend-vs-backend table).
struct OptimizerCase {
  std::string name;
  bool adam = false;
  float momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, decoupled = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float grad_scale = 1;  // gradient clipping's factor: PyTorch multiplies the gradients in place first

  std::unique_ptr<optim::Optimizer> make(const FlatParameters& p) const {
    if (adam)
      return std::make_unique<optim::Adam>(p, optim::AdamOptions{.beta1 = beta1,
                                                                 .beta2 = beta2,
                                                                 .eps = eps,
                                                                 .weight_decay = weight_decay,
                                                                 .decoupled_weight_decay = decoupled});
    return std::make_unique<optim::Sgd>(p, optim::SgdOptions{.momentum = momentum,
                                                             .dampening = dampening,
                                                             .nesterov = nesterov,
                                                             .weight_decay = weight_decay});
  }

  // Step t (from 1) at `lr` on every element, in double from the stored floats; parameters and state
  // stored back as float, as every backend stores them. State slots in the optimizer's order.
  void closed_form_step(int t, double lr, std::vector<float>& p, const std::vector<float>& g,
                        std::vector<std::vector<float>>& state) const {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double w = p[i];
      const double gi = g[i] * grad_scale;  // a float product, as in the gradient's storage
      if (adam) {
        if (decoupled) w *= 1.0 - lr * weight_decay;  // AdamW
        const double d = gi + (decoupled ? 0.0 : static_cast<double>(weight_decay) * w);
        const double m = beta1 * static_cast<double>(state[0][i]) + (1.0 - beta1) * d;
        const double v = beta2 * static_cast<double>(state[1][i]) + (1.0 - beta2) * d * d;
        const double correction1 = 1.0 - std::pow(static_cast<double>(beta1), t);
        const double correction2 = 1.0 - std::pow(static_cast<double>(beta2), t);
        w -= lr / correction1 * m / (std::sqrt(v) / std::sqrt(correction2) + eps);
        state[0][i] = static_cast<float>(m);
        state[1][i] = static_cast<float>(v);
      } else {
        const double d = gi + static_cast<double>(weight_decay) * w;
        double step = d;
        if (momentum != 0) {
          // PyTorch: the buffer starts as the first gradient, without dampening.
          const double buf = t == 1 ? d : momentum * static_cast<double>(state[0][i]) + (1.0 - dampening) * d;
          state[0][i] = static_cast<float>(buf);
          step = nesterov ? d + momentum * buf : buf;
        }
        w -= lr * step;
      }
      p[i] = static_cast<float>(w);
    }
  }
  std::size_t slots() const { return adam ? 2 : momentum != 0 ? 1 : 0; }
};

void check_optimizer(const OptimizerCase& c) {
  const std::vector<Shape> shapes = {{13, 7}, {1}, {257}, {64, 33}};
  struct Run {
    std::vector<float> values;
    std::vector<std::vector<float>> state;
  };
  const auto initial = [&] {
    std::vector<NamedTensor> params;
    for (std::size_t k = 0; k < shapes.size(); ++k)
      params.push_back(
          {"p" + std::to_string(k), Tensor::from_data(shapes[k], host_values(in(shapes[k]), 40 + k))});
    return params;
  };
  const auto gradients = [](int64_t n, int step) { return host_values(in({n}), 60 + step); };
  const auto learning_rate = [](int step) { return 0.01f * static_cast<float>(step); };
  const auto run = [&](Device device) {
    const FlatParameters flat(initial(), device);
    const auto optimizer = c.make(flat);
    for (int step = 1; step <= 3; ++step) {
      flat.grads().copy_from(Tensor::from_data({flat.size()}, gradients(flat.size(), step)));
      optimizer->step(learning_rate(step), c.grad_scale);
    }
    Run r{flat.values().to_vector(), {}};
    for (const Tensor& slot : optimizer->state_buffers()) r.state.push_back(slot.to_vector());
    return r;
  };
  Run expected;
  {
    const FlatParameters flat(initial(), Device::cpu());
    expected.values = flat.values().to_vector();
    expected.state.assign(c.slots(), std::vector<float>(expected.values.size(), 0.0f));
    for (int step = 1; step <= 3; ++step)
      c.closed_form_step(step, learning_rate(step), expected.values,
                         gradients(static_cast<int64_t>(expected.values.size()), step), expected.state);
  }
  std::vector<Device> devices = devices_under_test();
  devices.push_back(Device::reference());
  for (const Device device : devices) {
    const Run got = run(device);
    // Each update in double, rounded once per stored value, against the kernels' float arithmetic.
    constexpr double kTolerance = 1e-6;
    Row row{c.name,       "3 steps, 4 tensors (" + std::to_string(expected.values.size()) + " floats)",
            device.str(), error_of(got.values, expected.values),
            {},           kTolerance,
            true};
    row.ok = within(got.values, expected.values, kTolerance);
    EXPECT_TRUE(row.ok) << c.name << " on " << device.str() << ": parameters, error " << row.forward;
    ASSERT_EQ(got.state.size(), expected.state.size()) << c.name << " on " << device.str();
    for (std::size_t s = 0; s < got.state.size(); ++s) {
      row.gradients.push_back(error_of(got.state[s], expected.state[s]));
      const bool ok = within(got.state[s], expected.state[s], kTolerance);
      row.ok = row.ok && ok;
      EXPECT_TRUE(ok) << c.name << " on " << device.str() << ": state slot " << s << ", error "
                      << row.gradients.back();
    }
    rows().push_back(row);
  }
}

TEST(Optimizers, MatchTheClosedForm) {
  const std::vector<OptimizerCase> optimizers = {
      {.name = "sgd"},
      {.name = "sgd momentum, dampening, wd", .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-2f},
      {.name = "sgd nesterov", .momentum = 0.9f, .nesterov = true},
      {.name = "adam, L2", .adam = true, .weight_decay = 1e-2f},
      {.name = "adamw", .adam = true, .weight_decay = 1e-2f, .decoupled = true},
      {.name = "adam, betas 0.8/0.95, eps 1e-3", .adam = true, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-3f},
      {.name = "sgd momentum, wd, clipped", .momentum = 0.9f, .weight_decay = 1e-2f, .grad_scale = 0.37f},
      {.name = "sgd, clipped", .grad_scale = 0.37f},
      {.name = "adamw, clipped", .adam = true, .weight_decay = 1e-2f, .decoupled = true, .grad_scale = 0.37f},
  };
  for (const OptimizerCase& c : optimizers) check_optimizer(c);
}

TEST(Backends, AGpuIsTestedWhereOneIsRequired) {
  const char* require = std::getenv("DPTRAIN_REQUIRE_GPU");
  const bool gpu = devices_under_test().size() > 1;
  if (require != nullptr && std::string(require) == "1") {
    EXPECT_TRUE(gpu) << "DPTRAIN_REQUIRE_GPU=1 but no GPU backend is registered";
  } else if (!gpu) {
    GTEST_SKIP() << "no GPU backend registered: the table covers cpu against the reference only";
  }
}

void print_table() {
  std::printf("\n%-27s %-72s %-10s %9s  %-28s %6s %s\n", "op", "case", "backend", "forward",
              "input gradients / state", "tol", "");
  for (const Row& r : rows()) {
    std::string grads;
    for (double g : r.gradients) {
      char text[16];
      std::snprintf(text, sizeof text, "%s%.1e", grads.empty() ? "" : " ", g);
      grads += text;
    }
    std::printf("%-27s %-72s %-10s %9.1e  %-28s %6.0e %s\n", r.op.c_str(), r.shapes.c_str(),
                r.backend.c_str(), r.forward, grads.c_str(), r.tolerance, r.ok ? "ok" : "FAIL");
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#if defined(DPTRAIN_WITH_CUDA)
  // Every GPU of this machine joins the table (TF32 off: fp32 results within the tolerances).
  const dptrain::cuda::DeviceProbe probe = dptrain::cuda::probe_devices();
  for (int i = 0; i < probe.count; ++i) dptrain::cuda::use_gpu(i, probe.count, {});
  if (probe.count == 0) std::printf("no GPU in the table: %s\n", probe.reason.c_str());
#endif
  const int result = RUN_ALL_TESTS();
  if (!::testing::GTEST_FLAG(list_tests)) dptrain::print_table();
  dptrain::release_backend_caches();
  return result;
}
