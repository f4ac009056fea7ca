// The "batchnorm1d" layer against PyTorch's BatchNorm1d in closed form, computed here in double:
// training output, the three gradients and the running statistics for [C] and [C, L] samples,
// evaluation with the running statistics, PyTorch's tensor names, and its place in an MLP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/parameters.h"
#include "layers/build.h"
#include "layers/module.h"
#include "tests/test_util.h"

namespace dptrain::layers {
namespace {

constexpr double kEps = 1e-5, kMomentum = 0.1;

using test_util::expect_error;
using test_util::uniform_values;

void expect_close(std::span<const float> ours, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  for (std::size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(ours[i], ref[i], 1e-5 + 1e-5 * std::abs(ref[i])) << what << "[" << i << "]";
}

// BatchNorm1d over x [B, C, L] (L = 1 for [B, C]) with weight w and bias b, the objective sum(y * g).
struct Reference {
  std::vector<double> y, gx, gw, gb, running_mean, running_var;
};

Reference reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                    const std::vector<float>& g, int64_t batch, int64_t channels, int64_t length) {
  Reference r;
  const auto at = [&](int64_t n, int64_t c, int64_t l) {
    return static_cast<std::size_t>((n * channels + c) * length + l);
  };
  r.y.resize(x.size());
  r.gx.resize(x.size());
  const double count = static_cast<double>(batch * length);
  for (int64_t c = 0; c < channels; ++c) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t l = 0; l < length; ++l) mean += x[at(n, c, l)];
    mean /= count;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t l = 0; l < length; ++l) var += std::pow(x[at(n, c, l)] - mean, 2);
    var /= count;
    const double inv_std = 1.0 / std::sqrt(var + kEps);
    double sum_g = 0, sum_g_xhat = 0;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t l = 0; l < length; ++l) {
        const double xhat = (x[at(n, c, l)] - mean) * inv_std;
        r.y[at(n, c, l)] = w[c] * xhat + b[c];
        sum_g += g[at(n, c, l)];
        sum_g_xhat += g[at(n, c, l)] * xhat;
      }
    r.gb.push_back(sum_g);
    r.gw.push_back(sum_g_xhat);
    // d/dx of the normalisation with batch statistics: w / std * (g - mean(g) - xhat * mean(g xhat)).
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t l = 0; l < length; ++l) {
        const double xhat = (x[at(n, c, l)] - mean) * inv_std;
        r.gx[at(n, c, l)] = w[c] * inv_std * (g[at(n, c, l)] - sum_g / count - xhat * sum_g_xhat / count);
      }
    // Running variance from the unbiased batch variance, from the initial 0 and 1.
    r.running_mean.push_back(kMomentum * mean);
    r.running_var.push_back((1 - kMomentum) + kMomentum * var * count / (count - 1));
  }
  return r;
}

// On the CPU backend (what users train with) and on the reference backend (naive, in double): a
// sample of [C] gives the batch-norm kernels one value per (sample, channel), which no BatchNorm2d
// input does.
struct Case {
  const char* name;
  Device device;
  Shape per_sample;
};

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.name;
}

class BatchNorm1dTest : public ::testing::TestWithParam<Case> {};

TEST_P(BatchNorm1dTest, TrainingMatchesClosedFormAndEvaluationUsesRunningStatistics) {
  const Shape per_sample = GetParam().per_sample;
  const Device device = GetParam().device;
  const int64_t batch = 5, channels = per_sample[0], length = per_sample.size() == 2 ? per_sample[1] : 1;
  Shape shape{batch};
  shape.insert(shape.end(), per_sample.begin(), per_sample.end());
  autograd::clear_tape();
  const auto model = build_sequential(Json::parse(R"([{"type": "batchnorm1d"}])"), per_sample, 0);
  ASSERT_EQ(model->output_shape(per_sample), per_sample);
  const std::vector<NamedTensor> params = model->named_parameters();
  ASSERT_EQ(params.size(), 2u);
  // Away from the initial ones and zeros, so that a swapped or ignored affine parameter shows.
  const std::vector<float> w = uniform_values(channels, 1, 0.5f, 1.5f), b = uniform_values(channels, 2);
  std::copy(w.begin(), w.end(), params[0].tensor.data());
  std::copy(b.begin(), b.end(), params[1].tensor.data());
  // An offset and a scale per channel, as real activations have.
  std::vector<float> xs = uniform_values(shape_numel(shape), 3);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = 3.0f * xs[i] + static_cast<float>((i / length) % channels);
  const std::vector<float> g = uniform_values(shape_numel(shape), 4);
  const Reference ref = reference(xs, w, b, g, batch, channels, length);

  // The layer's tensors now live on `device` (the layer holds the same tensors).
  const FlatParameters on_device(params, device), buffers_on_device(model->named_buffers(), device);
  const Tensor x = Tensor::from_data(shape, xs).to(device);
  x.set_requires_grad(true);
  const Tensor y = model->forward(x);
  expect_close(y.to_vector(), ref.y, "y");
  autograd::backward(y, Tensor::from_data(y.shape(), g).to(device));
  expect_close(x.grad(), ref.gx, "grad x");
  expect_close(params[0].tensor.grad(), ref.gw, "grad weight");
  expect_close(params[1].tensor.grad(), ref.gb, "grad bias");
  const std::vector<NamedTensor> buffers = model->named_buffers();
  ASSERT_EQ(buffers.size(), 3u);
  expect_close(buffers[0].tensor.to_vector(), ref.running_mean, "running_mean");
  expect_close(buffers[1].tensor.to_vector(), ref.running_var, "running_var");
  EXPECT_EQ(buffers[2].tensor.to_vector(), std::vector<float>{1.0f}) << "num_batches_tracked";

  model->set_training(false);
  NoGradGuard no_grad;
  const Tensor evaluated = model->forward(x);
  std::vector<double> expected(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t c = (i / static_cast<std::size_t>(length)) % static_cast<std::size_t>(channels);
    expected[i] = w[c] * (xs[i] - ref.running_mean[c]) / std::sqrt(ref.running_var[c] + kEps) + b[c];
  }
  expect_close(evaluated.to_vector(), expected, "evaluation y");
  EXPECT_EQ(buffers[2].tensor.to_vector(), std::vector<float>{1.0f}) << "evaluation counts no batch";
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchNorm1dTest,
                         ::testing::Values(Case{"cpu_C", Device::cpu(), {4}},
                                           Case{"cpu_CL", Device::cpu(), {3, 6}},
                                           Case{"reference_C", Device::reference(), {4}},
                                           Case{"reference_CL", Device::reference(), {3, 6}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

TEST(BatchNorm1d, PyTorchNamesInAnMlpAndSyncBatchNorm) {
  const auto model =
      build_sequential(Json::parse(R"([{"type": "flatten"}, {"type": "dense", "out_features": 6},
                                                      {"type": "batchnorm1d"}, {"type": "relu"},
                                                      {"type": "dense", "out_features": 3}])"),
                       {1, 4, 4}, 7);
  EXPECT_EQ(model->output_shape({1, 4, 4}), (Shape{3}));
  std::vector<std::string> names;
  for (const NamedTensor& t : state_tensors(*model)) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"1.weight", "1.bias", "2.weight", "2.bias", "4.weight", "4.bias",
                                             "2.running_mean", "2.running_var", "2.num_batches_tracked"}));
  EXPECT_EQ(model->named_buffers().back().stored, StoredType::kI64);
  EXPECT_EQ(model->layer(2).describe(), "BatchNorm1d(6)");

  // The trainer's SyncBatchNorm hook reaches it through the Sequential like any BatchNorm.
  struct Counting : CrossReplicaSum {
    void sum(double* /*values*/, int64_t /*n*/, Device /*device*/, const char* /*what*/) override { ++calls; }
    int calls = 0;
  } sync;
  model->sync_batch_statistics(&sync);
  EXPECT_EQ(model->layer(2).describe(), "BatchNorm1d(6, synchronised across ranks)");
  NoGradGuard no_grad;
  model->forward(Tensor::from_data({4, 1, 4, 4}, uniform_values(64, 9)));
  EXPECT_GT(sync.calls, 0);
}

TEST(BatchNorm1d, ErrorsNameTheKey) {
  expect_error(
      [] {
        build_sequential(Json::parse(R"([{"type": "batchnorm1d"}])"), {3, 8, 8}, 0);
      },
      {"model.layers[0].type", "batchnorm1d", "use batchnorm2d"});
  expect_error([] { build_sequential(Json::parse(R"([{"type": "batchnorm1d", "momentum": 0.2}])"), {4}, 0); },
               {"model.layers[0].momentum", "not a known key"});
}

}  // namespace
}  // namespace dptrain::layers
