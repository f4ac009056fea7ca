// Tests for cuda/: the checks and the probe run everywhere; everything that needs a GPU skips with
// the probe's reason where there is none. Kernels are compared with the CPU implementations they
// mirror (optim::Sgd / optim::Adam, core/half.h); NCCL with one rank (a GPU hosts one NCCL rank).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/parameters.h"
#include "core/rng.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/nccl_communicator.h"
#include "optim/optimizer.h"

namespace dptrain::cuda {
namespace {

#define SKIP_WITHOUT_GPU()                                                    \
  do {                                                                        \
    const DeviceProbe probe = probe_devices();                                \
    if (probe.count == 0) GTEST_SKIP() << "no CUDA device: " << probe.reason; \
    select_device(0);                                                         \
  } while (0)

std::vector<float> random_values(std::size_t n, uint64_t seed, float lo, float hi) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, float atol,
                  float rtol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i)
    ASSERT_LE(std::fabs(actual[i] - expected[i]), atol + rtol * std::fabs(expected[i]))
        << "at " << i << ": " << actual[i] << " vs " << expected[i];
}

TEST(CudaCheck, AFailedCallNamesTheCallAndTheError) {
  try {
    DPTRAIN_CUDA_CHECK(cudaSetDevice(4096));  // no machine has that many devices, or a driver says why
    FAIL() << "cudaSetDevice(4096) succeeded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cudaSetDevice(4096) failed: cuda"), std::string::npos) << message;
    EXPECT_NE(message.find("cuda_test.cpp:"), std::string::npos) << message;
  }
}

TEST(CudaDevice, ProbeNeverThrowsAndExplainsAbsence) {
  const DeviceProbe probe = probe_devices();
  EXPECT_GE(probe.count, 0);
  if (probe.count == 0) {
    EXPECT_FALSE(probe.reason.empty());
    EXPECT_THROW(select_device(0), Error);
  }
}

TEST(CudaDevice, CachingAllocatorReusesBlocks) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  for (int step = 0; step < 3; ++step) {
    DeviceBuffer<float> a(allocator, 1000), b(allocator, 4000);
    std::vector<float> host = random_values(1000, 1, -1, 1), back(1000);
    a.copy_from_host(host.data(), host.size());
    a.copy_to_host(back.data(), back.size());
    EXPECT_EQ(back, host);
  }
  EXPECT_EQ(allocator.fresh_allocations(), 2u) << "steady-state steps must not call cudaMalloc";
}

// Parameters of two tensors in flat buffers, updated on the device and by the CPU optimizer.
template <typename CpuOptimizer, typename Options, typename DeviceStep>
void compare_with_cpu(const Options& options, int slots, DeviceStep device_step) {
  const std::vector<int64_t> sizes = {300, 77};
  std::vector<NamedTensor> params;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    params.push_back(
        {"p" + std::to_string(k), Tensor::from_data({sizes[k]}, random_values(sizes[k], 2 + k, -1, 1))});
  const dptrain::FlatParameters flat(params, Device::cpu());
  CpuOptimizer cpu(flat, options);
  const int64_t total = flat.size();
  CachingAllocator allocator;
  DeviceBuffer<float> d_params(allocator, total), d_grads(allocator, total), d_s0(allocator, total),
      d_s1(allocator, total);
  const std::vector<float> zeros(total, 0.0f);
  d_params.copy_from_host(flat.values().data(), total);
  d_s0.copy_from_host(zeros.data(), total);
  d_s1.copy_from_host(zeros.data(), total);
  for (int64_t step = 1; step <= 5; ++step) {
    const std::vector<float> grads = random_values(total, 10 + step, -0.5f, 0.5f);
    std::copy(grads.begin(), grads.end(), flat.grads().data());
    cpu.step(0.01f);
    d_grads.copy_from_host(grads.data(), total);
    device_step(d_params.data(), d_grads.data(), d_s0.data(), slots > 1 ? d_s1.data() : nullptr, total, step);
    DPTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> actual(total);
  d_params.copy_to_host(actual.data(), total);
  expect_close(actual, flat.values().to_vector(), 1e-6f,
               1e-5f);  // FMA contraction on the device differs in the last bits
}

TEST(CudaKernels, FusedSgdWithNesterovMomentumMatchesTheCpuOptimizer) {
  SKIP_WITHOUT_GPU();
  const optim::SgdOptions o{0.9f, 0.0f, true, 1e-4f};
  compare_with_cpu<optim::Sgd>(o, 1, [&](float* p, float* g, float* s0, float*, int64_t n, int64_t step) {
    sgd_step(p, g, s0, n, {0.01f, o.momentum, o.dampening, o.weight_decay, o.nesterov, step == 1}, nullptr);
  });
}

TEST(CudaKernels, FusedAdamWMatchesTheCpuOptimizer) {
  SKIP_WITHOUT_GPU();
  const optim::AdamOptions o{0.9f, 0.999f, 1e-8f, 1e-2f, true};
  compare_with_cpu<optim::Adam>(o, 2, [&](float* p, float* g, float* s0, float* s1, int64_t n, int64_t step) {
    const double t = static_cast<double>(step);
    const AdamStep s{
        .beta1 = o.beta1,
        .beta2 = o.beta2,
        .eps = o.eps,
        .step_size = static_cast<float>(0.01 / (1.0 - std::pow(static_cast<double>(o.beta1), t))),
        .bias_correction2_sqrt =
            static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), t))),
        .decay = static_cast<float>(1.0 - 0.01 * o.weight_decay),
        .l2 = 0.0f};
    adam_step(p, g, s0, s1, n, s, nullptr);
  });
}

TEST(CudaKernels, HalfCastsRoundLikeTheCpuConversions) {
  SKIP_WITHOUT_GPU();
  std::vector<float> values = random_values(4096, 3, -70000.0f, 70000.0f);
  const std::vector<float> small = random_values(1024, 4, -1e-6f, 1e-6f);  // fp16 subnormals
  values.insert(values.end(), small.begin(), small.end());
  const int64_t n = static_cast<int64_t>(values.size());
  CachingAllocator allocator;
  DeviceBuffer<float> d_values(allocator, n), d_back(allocator, n);
  DeviceBuffer<uint16_t> d_halves(allocator, n);
  d_values.copy_from_host(values.data(), n);
  for (HalfFormat format : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    std::vector<uint16_t> expected(n), actual(n);
    dptrain::floats_to_halves(values.data(), expected.data(), n, 0.5f, format);
    cuda::floats_to_halves(d_values.data(), d_halves.data(), n, 0.5f, format, nullptr);
    d_halves.copy_to_host(actual.data(), n);
    EXPECT_EQ(actual, expected) << (format == HalfFormat::kFp16 ? "fp16" : "bf16");
    std::vector<float> expected_back(n), actual_back(n);
    dptrain::halves_to_floats(expected.data(), expected_back.data(), n, format);
    cuda::halves_to_floats(d_halves.data(), d_back.data(), n, format, nullptr);
    d_back.copy_to_host(actual_back.data(), n);
    EXPECT_EQ(std::memcmp(actual_back.data(), expected_back.data(), n * sizeof(float)), 0);
  }
}

TEST(CudaNccl, OneRankAllreduceAndCompressedAllreduce) {
  SKIP_WITHOUT_GPU();
  NcclCommunicator nccl(NcclCommunicator::new_unique_id(), 0, 1);
  const std::vector<float> values = random_values(10000, 5, -3, 3);
  const int64_t n = static_cast<int64_t>(values.size());
  CachingAllocator allocator;
  DeviceBuffer<float> d(allocator, n);
  DeviceBuffer<uint16_t> staging(allocator, n);
  d.copy_from_host(values.data(), n);
  nccl.allreduce_sum({d.data(), values.size()}, nullptr);
  std::vector<float> out(n);
  d.copy_to_host(out.data(), n);
  EXPECT_EQ(out, values);  // the sum over one rank

  // Compressed: the prescaled values rounded to fp16 and back, as the CPU reducer computes them.
  nccl.allreduce_sum_compressed({d.data(), values.size()}, {staging.data(), values.size()}, 0.5f,
                                HalfFormat::kFp16, nullptr);
  d.copy_to_host(out.data(), n);
  std::vector<uint16_t> halves(n);
  std::vector<float> expected(n);
  dptrain::floats_to_halves(values.data(), halves.data(), n, 0.5f, HalfFormat::kFp16);
  dptrain::halves_to_floats(halves.data(), expected.data(), n, HalfFormat::kFp16);
  EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace dptrain::cuda

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const dptrain::cuda::DeviceProbe probe = dptrain::cuda::probe_devices();
  if (probe.count == 0) std::printf("SKIP: GPU tests skipped: no CUDA device (%s)\n", probe.reason.c_str());
  return RUN_ALL_TESTS();
}
