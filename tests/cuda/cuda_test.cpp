// Tests for cuda/ beyond the op table (which tests/core/backend_conformance_test runs on the CUDA
// backend against the reference): error checks, device choice, the backend's memory and copies,
// and the NCCL communicator on one rank. The checks and the probe run everywhere; everything that
// needs a GPU skips with the probe's reason where there is none, and DPTRAIN_REQUIRE_GPU=1 makes
// such a skip a failure.
#include <cudnn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
#include "cuda/ranked.h"
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

// cuDNN's ranked algorithms: the first that works is taken, those that fail are passed over, and
// when none works the error names each failure. Plain logic: runs without a GPU.
TEST(RankedCandidates, TheFirstThatWorksIsTakenAndFailuresAreNamed) {
  std::vector<std::size_t> tried;
  const auto attempt = [&](std::size_t i) -> std::string {
    tried.push_back(i);
    return i < 2 ? "algorithm " + std::to_string(i) + ": not supported" : "";
  };
  EXPECT_EQ(first_working(4, 0, "cuDNN forward", "hint", attempt), 2u);
  EXPECT_EQ(tried, (std::vector<std::size_t>{0, 1, 2}));
  tried.clear();
  EXPECT_EQ(first_working(4, 2, "cuDNN forward", "hint", attempt), 2u);  // kept from the last call
  EXPECT_EQ(tried, (std::vector<std::size_t>{2}));
  const std::string message = test_util::error_of(
      [&] { first_working(2, 0, "cuDNN forward", "try cuda.deterministic false", attempt); });
  EXPECT_CONTAINS(message,
                  "cuDNN forward: no candidate worked (2 tried: algorithm 0: not supported; "
                  "algorithm 1: not supported); try cuda.deterministic false");
}

// A candidate whose failure no other can repair (it added part of a sum) ends the search: its
// exception passes through, and no later candidate runs.
TEST(RankedCandidates, AnAttemptThatThrowsEndsTheSearch) {
  std::vector<std::size_t> tried;
  const auto attempt = [&](std::size_t i) -> std::string {
    tried.push_back(i);
    DPTRAIN_CHECK(i != 1, "algorithm 1 failed part-way");
    return "algorithm " + std::to_string(i) + ": not supported";
  };
  EXPECT_CONTAINS(test_util::error_of([&] { first_working(4, 0, "cuDNN backward", "hint", attempt); }),
                  "algorithm 1 failed part-way");
  EXPECT_EQ(tried, (std::vector<std::size_t>{0, 1}));
}

// Which of cuDNN 9's statuses come before any output is written (a retry is safe even when the call
// adds into its output), by the statuses' names in cuDNN's own header.
TEST(RankedCandidates, OnlyBadParametersAndUnsupportedCasesFailBeforeWriting) {
  for (cudnnStatus_t status :
       {CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_BAD_PARAM_NULL_POINTER, CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
        CUDNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_NOT_SUPPORTED_SHAPE,
        CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT})
    EXPECT_TRUE(cudnn_failed_before_writing(status)) << "status " << static_cast<int>(status);
  for (cudnnStatus_t status :
       {CUDNN_STATUS_SUCCESS, CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_INTERNAL_ERROR,
        CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, CUDNN_STATUS_EXECUTION_FAILED,
        CUDNN_STATUS_EXECUTION_FAILED_CUDART})
    EXPECT_FALSE(cudnn_failed_before_writing(status)) << "status " << static_cast<int>(status);
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
  if (count == 1 && std::getenv("CUDA_VISIBLE_DEVICES") != nullptr) {
    // A launcher's one GPU per rank: every rank takes the one it sees, and if two ranks were shown
    // the same one, the NCCL communicator's UUID check says so (OneGpuPerRankIsCheckedByUuid).
    EXPECT_EQ(choose_device(1, 2, false), 0);
    return;
  }
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

// upload(): a batch's copy in its own pool, ordered after the release of an earlier batch rather than
// after the compute queued before it. A released batch's block, reused by the next upload, is only
// overwritten once the compute stream has passed its last reader (the device-to-device copy here,
// queued behind a large one so that it is still pending when the next upload is issued).
TEST(CudaBackendMemory, UploadsReuseABlockOnlyAfterItsLastReader) {
  REQUIRE_GPU();
  CudaBackend& b = gpu();
  constexpr std::size_t kFloats = 3000001, kBytes = kFloats * sizeof(float);
  void* big = b.allocate(64 * kBytes);
  void* big_copy = b.allocate(64 * kBytes);
  std::vector<void*> copies;
  std::vector<std::vector<float>> batches;
  for (int i = 0; i < 4; ++i) {
    batches.push_back(test_util::uniform_values(kFloats, 40 + i));
    void* batch = b.upload(batches.back().data(), kBytes);
    b.copy(big_copy, big, 64 * kBytes);  // keeps the compute stream busy
    copies.push_back(b.allocate(kBytes));
    b.copy(copies.back(), batch, kBytes);
    b.release(batch, kBytes);
  }
  for (std::size_t i = 0; i < copies.size(); ++i) {
    std::vector<float> back(kFloats);
    b.copy_to_host(back.data(), copies[i], kBytes);
    EXPECT_EQ(back, batches[i]) << "batch " << i;
    b.release(copies[i], kBytes);
  }
  EXPECT_EQ(b.upload(batches[0].data(), 0), nullptr);
  b.release(big, 0);
  b.release(big_copy, 0);
}

// The loader's slots (allocate_host) are uploaded from in place, not through the pinned staging
// buffers, and may be rewritten once wait_for_uploads() returns, even while the compute stream is
// still busy with work queued before the upload.
TEST(CudaBackendMemory, HostBlocksAreUploadedInPlaceAndRewritableAfterTheWait) {
  REQUIRE_GPU();
  CudaBackend& b = gpu();
  constexpr std::size_t kFloats = 6000001, kBytes = kFloats * sizeof(float);
  void* big = b.allocate(64 * kBytes);
  void* big_copy = b.allocate(64 * kBytes);
  float* host = static_cast<float*>(b.allocate_host(kBytes + sizeof(float)));
  const std::vector<float> batch = test_util::uniform_values(kFloats, 7);
  std::copy(batch.begin(), batch.end(), host + 1);  // a range inside the block, not its start
  const int in_place_before = b.in_place_uploads();
  b.copy(big_copy, big, 64 * kBytes);  // keeps the compute stream busy
  void* uploaded = b.upload(host + 1, kBytes);
  b.wait_for_uploads();
  std::fill(host, host + kFloats + 1, -1.0f);
  EXPECT_EQ(b.in_place_uploads(), in_place_before + 1) << "the upload was staged, not read in place";
  std::vector<float> back(kFloats);
  b.copy_to_host(back.data(), uploaded, kBytes);
  EXPECT_EQ(back, batch);
  // Memory of anyone else's is staged: its owner may rewrite it as soon as upload() returns.
  void* staged = b.upload(batch.data(), kBytes);
  EXPECT_EQ(b.in_place_uploads(), in_place_before + 1);
  b.release(staged, kBytes);
  b.release(uploaded, kBytes);
  b.release_host(host);
  b.release_host(nullptr);
  b.release(big, 0);
  b.release(big_copy, 0);
}

// Uploads that grow a little each time (an epoch's batches after a smaller one, evaluation) grow
// the pinned staging buffers geometrically: each allocation synchronizes the device.
TEST(CudaBackendMemory, GrowingUploadsAllocatePinnedMemoryRarely) {
  REQUIRE_GPU();
  CudaBackend& b = gpu();
  const std::vector<float> host = test_util::uniform_values(4000, 3);
  void* device = b.allocate(host.size() * sizeof(float));
  const int before = b.pinned_allocations();
  for (std::size_t n = 1000; n <= 4000; n += 10) b.copy_from_host(device, host.data(), n * sizeof(float));
  b.synchronize();
  // Two buffers in turn, each doubling at least: from 4 KB past 16 KB is 3 doublings at most.
  EXPECT_LE(b.pinned_allocations() - before, 2 * 3);
  b.release(device, 0);
}

// The upload pool keeps a released batch's block; an allocation that needs that memory gets it back
// (allocate() trims the upload pool and tries again) instead of failing. The device is filled to 2 GiB
// of its free memory, a 1 GiB batch is uploaded and released, and 1.5 GiB is then asked for: more
// than the driver has left while the upload pool holds the batch's block. (Where the driver refuses
// a pool for uploads, the batch's block is the default pool's, which reuses it anyway.)
TEST(CudaBackendMemory, AllocationsGetTheUploadPoolsIdleMemory) {
  REQUIRE_GPU();
  gpu().synchronize();
  CudaBackend b(0, {});
  cudaMemPool_t pool;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, b.device().index), cudaSuccess);
  ASSERT_EQ(cudaMemPoolTrimTo(pool, 0), cudaSuccess);  // other tests' idle blocks: back to the driver
  constexpr std::size_t kGiB = std::size_t{1} << 30;
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  ASSERT_GT(free, 4 * kGiB);
  void* filler = b.allocate(free - 2 * kGiB);
  const std::vector<char> batch(kGiB, 1);
  b.release(b.upload(batch.data(), batch.size()), batch.size());
  b.synchronize();
  void* needed = nullptr;
  EXPECT_NO_THROW(needed = b.allocate(kGiB + kGiB / 2));
  EXPECT_NE(needed, nullptr);
  b.release(needed, 0);
  b.release(filler, 0);
  b.synchronize();
}

// cuda.cudnn_benchmark ranks the algorithms by timing them: another algorithm, the same convolution.
TEST(CudaConv, TimedAlgorithmsAgreeWithTheHeuristics) {
  REQUIRE_GPU();
  CudaBackend heuristic(0, {}), timed(0, {.cudnn_benchmark = true});
  const Conv2dGeometry g{8, 16, 20, 20, 32, 3, 3, 20, 20, 1, 1, /*fuse_relu=*/false};
  const std::vector<float> x = test_util::uniform_values(8 * 16 * 20 * 20, 11),
                           w = test_util::uniform_values(32 * 16 * 3 * 3, 12);
  std::vector<std::vector<float>> outputs;
  for (CudaBackend* b : {&heuristic, &timed}) {
    const std::size_t x_bytes = x.size() * sizeof(float), w_bytes = w.size() * sizeof(float),
                      y_bytes = std::size_t{8} * 32 * 20 * 20 * sizeof(float);
    void* dx = b->allocate(x_bytes);
    void* dw = b->allocate(w_bytes);
    void* dy = b->allocate(y_bytes);
    b->copy_from_host(dx, x.data(), x_bytes);
    b->copy_from_host(dw, w.data(), w_bytes);
    b->conv2d(static_cast<const float*>(dx), static_cast<const float*>(dw), nullptr, static_cast<float*>(dy),
              g);
    outputs.emplace_back(y_bytes / sizeof(float));
    b->copy_to_host(outputs.back().data(), dy, y_bytes);
    for (void* p : {dx, dw, dy}) b->release(p, 0);
  }
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < outputs[0].size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(outputs[0][i]) - outputs[1][i]));
    scale = std::max(scale, std::abs(static_cast<double>(outputs[0][i])));
  }
  EXPECT_LE(worst, 1e-5 * scale);
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

// A host world of two in which the other rank reports this rank's GPU: two ranks on one GPU.
class TwinHost final : public distributed::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  bool accepts(Device device) const override { return device.is_host(); }
  void wait(distributed::Pending& pending) override { pending.take(); }
  void barrier(const std::string&) override {}
  std::vector<std::string> gather_to_root(const std::string& mine, const std::string&) override {
    return {mine, mine};
  }
  distributed::Pending start_allreduce_elements(void*, std::size_t, distributed::DataType,
                                                distributed::ReduceOp, std::string, std::string) override {
    return {};
  }
  void allreduce_elements(void*, std::size_t, distributed::DataType, distributed::ReduceOp,
                          const std::string&) override {}
  void broadcast_elements(void*, std::size_t, distributed::DataType, int, const std::string&) override {}
  void allgather_elements(const void* send, void* recv, std::size_t count, distributed::DataType type,
                          const std::string&) override {
    const std::size_t bytes = count * distributed::element_size(type);
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
  }
  distributed::Pending start_reduce_scatter_elements(void*, std::size_t, distributed::DataType,
                                                     distributed::ReduceOp, std::string,
                                                     std::string) override {
    return {};
  }
  distributed::Pending start_allgather_in_place_elements(void*, std::size_t, distributed::DataType,
                                                         std::string, std::string) override {
    return {};
  }
};

// Two ranks on one GPU stop with the project's message before NCCL meets them ("Duplicate GPU").
TEST(CudaNccl, OneGpuPerRankIsCheckedByUuid) {
  REQUIRE_GPU();
  TwinHost host;
  const std::string message = test_util::error_of([&] { NcclCommunicator nccl(host, gpu()); });
  EXPECT_CONTAINS(message, "ranks 0 and 1 would share one GPU");
  EXPECT_CONTAINS(message, "distributed.backend to \"mpi\"");
}

// NCCL on one rank, joined from an id with no MPI: sums and averages leave the values as they are,
// half-precision sums round once, a broadcast from rank 0 keeps them, an allgather copies them, and
// a reduce-scatter and an in-place allgather leave them.
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
  // One rank's reduce-scatter and in-place allgather: its one chunk is the whole buffer, unchanged.
  distributed::Pending rs = nccl.start_reduce_scatter(std::span<float>(t.data_ptr(), values.size()),
                                                      distributed::ReduceOp::kAverage, "test reduce-scatter");
  EXPECT_TRUE(rs.active());
  nccl.wait(rs);
  EXPECT_EQ(t.to_vector(), values);
  nccl.allgather_in_place(std::span<float>(t.data_ptr(), values.size()), "test allgather in place");
  EXPECT_EQ(t.to_vector(), values);
}

}  // namespace
}  // namespace dptrain::cuda

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const dptrain::cuda::DeviceProbe probe = dptrain::cuda::probe_devices();
  if (probe.count == 0) std::printf("SKIP: GPU tests skipped: no CUDA device (%s)\n", probe.reason.c_str());
  const int result = RUN_ALL_TESTS();
  dptrain::release_backend_caches();
  return result;
}
