// Tests for cuda/ beyond the op table (which tests/core/backend_conformance_test runs on the CUDA
// backend against the reference): error checks, device choice, the backend's memory and copies,
// and the NCCL communicator on one rank. The checks and the probe run everywhere; everything that
// needs a GPU skips with the probe's reason where there is none, and DPTRAIN_REQUIRE_GPU=1 makes
// such a skip a failure.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/nccl_communicator.h"
#include "cuda/runtime.h"
#include "tests/test_util.h"

namespace dptrain::cuda {
namespace {

bool gpu_required() {
  const char* v = std::getenv("DPTRAIN_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// The CUDA backend of GPU 0, registered once; skips (or fails, where a GPU is required) without one.
#define REQUIRE_GPU()                                                             \
  do {                                                                            \
    const DeviceProbe probe = probe_devices();                                    \
    if (probe.count == 0) {                                                       \
      if (gpu_required()) FAIL() << "DPTRAIN_REQUIRE_GPU=1 but " << probe.reason; \
      GTEST_SKIP() << "no CUDA device: " << probe.reason;                         \
    }                                                                             \
  } while (0)

CudaBackend& gpu() {
  return dynamic_cast<CudaBackend&>(backend_for(use_gpu(0, 1, {})));
}

TEST(CudaCheck, AFailedCallNamesTheCallAndLeavesNoErrorBehind) {
  try {
    DPTRAIN_CUDA_CHECK(cudaSetDevice(4096));  // no machine has that many devices, or a driver says why
    FAIL() << "cudaSetDevice(4096) succeeded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cudaSetDevice(4096) failed: cuda"), std::string::npos) << message;
    EXPECT_NE(message.find("cuda_test.cpp:"), std::string::npos) << message;
  }
  // The next launch check must not blame a later call for this one. (Without a usable driver every
  // call fails the same way, so there is nothing to clear.)
  if (probe_devices().count > 0) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

TEST(CudaDevice, ProbeNeverThrowsAndExplainsAbsence) {
  const DeviceProbe probe = probe_devices();
  EXPECT_GE(probe.count, 0);
  if (probe.count > 0) return;
  EXPECT_FALSE(probe.reason.empty());
  try {
    choose_device(0, 1, false);
    FAIL() << "choose_device without a GPU succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no usable GPU"), std::string::npos) << e.what();
  }
}

TEST(CudaDevice, MoreRanksThanGpusIsAnErrorUnlessShared) {
  REQUIRE_GPU();
  const int count = probe_devices().count;
  try {
    choose_device(count, count + 1, false);
    FAIL() << "ranks beyond the GPU count were given a GPU";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(std::to_string(count + 1) + " ranks"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(count) + " GPU(s)"), std::string::npos) << message;
  }
  EXPECT_EQ(choose_device(count, count + 1, true), 0);
}

// Copies in both directions for sizes from nothing to past one pinned buffer, alternating sizes so
// that both upload buffers grow and are reused; a device-to-device copy in between.
TEST(CudaBackendMemory, CopiesRoundTripAtEverySize) {
  REQUIRE_GPU();
  CudaBackend& b = gpu();
  for (std::size_t n : {0u, 1u, 1000u, 7u, 3000000u, 5u, 3000001u}) {
    const std::vector<float> host = test_util::uniform_values(n, n + 1);
    void* a = b.allocate(n * sizeof(float));
    void* c = b.allocate(n * sizeof(float));
    b.copy_from_host(a, host.data(), n * sizeof(float));
    b.copy(c, a, n * sizeof(float));
    std::vector<float> back(n, -7.0f);
    b.copy_to_host(back.data(), c, n * sizeof(float));
    EXPECT_EQ(back, host) << n << " floats";
    b.release(a, n * sizeof(float));
    b.release(c, n * sizeof(float));
  }
}

// The stream-ordered pool keeps freed memory: steps of the same shapes reserve nothing new.
TEST(CudaBackendMemory, SteadyStateStepsReserveNothingNew) {
  REQUIRE_GPU();
  CudaBackend& b = gpu();
  cudaMemPool_t pool;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, b.device().index), cudaSuccess);
  const auto step = [&] {
    std::vector<void*> blocks;
    for (std::size_t bytes : {1u << 20, 3u << 20, 4096u, 1u << 20}) blocks.push_back(b.allocate(bytes));
    for (void* p : blocks) b.release(p, 0);
  };
  step();
  b.synchronize();
  uint64_t before = 0, after = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &before), cudaSuccess);
  for (int i = 0; i < 5; ++i) step();
  b.synchronize();
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &after), cudaSuccess);
  EXPECT_EQ(after, before);
}

// NCCL on one rank, joined from an id with no MPI: sums and averages leave the values as they are,
// half-precision sums round once, a broadcast from rank 0 keeps them, an allgather copies them.
TEST(CudaNccl, OneRankCollectives) {
  REQUIRE_GPU();
  CudaBackend& b = gpu();
  NcclCommunicator nccl(NcclCommunicator::new_unique_id(), 0, 1, b);
  EXPECT_TRUE(nccl.accepts(b.device()));
  EXPECT_FALSE(nccl.accepts(Device::cpu()));
  const std::vector<float> values = test_util::uniform_values(10000, 5);
  const Tensor t = Tensor::from_data({10000}, values).to(b.device());
  nccl.allreduce(std::span<float>(t.data_ptr(), values.size()), distributed::ReduceOp::kSum, "test sum");
  EXPECT_EQ(t.to_vector(), values);
  distributed::Pending p = nccl.start_allreduce(std::span<float>(t.data_ptr(), values.size()),
                                                distributed::ReduceOp::kAverage, "avg");
  EXPECT_TRUE(p.active());
  nccl.wait(p);
  EXPECT_FALSE(p.active());
  EXPECT_EQ(t.to_vector(), values);
  nccl.broadcast(std::span<float>(t.data_ptr(), values.size()), 0, "test broadcast");
  EXPECT_EQ(t.to_vector(), values);
  const Tensor gathered = Tensor::zeros({10000}, b.device());
  nccl.allgather(std::span<const float>(t.data_ptr(), values.size()),
                 std::span<float>(gathered.data_ptr(), values.size()), "test allgather");
  EXPECT_EQ(gathered.to_vector(), values);
}

}  // namespace
}  // namespace dptrain::cuda

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const dptrain::cuda::DeviceProbe probe = dptrain::cuda::probe_devices();
  if (probe.count == 0) std::printf("SKIP: GPU tests skipped: no CUDA device (%s)\n", probe.reason.c_str());
  return RUN_ALL_TESTS();
}
