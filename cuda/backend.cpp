// The CUDA backend: memory, copies, cuBLAS/cuBLASLt GEMMs, cuDNN convolutions, and the kernels.
#include "cuda/backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "cuda/kernels.h"
#include "cuda/ranked.h"

namespace dptrain::cuda {
namespace {

constexpr std::size_t kMaxWorkspace = std::size_t{1} << 30;  // cuDNN / cuBLASLt scratch, at most
constexpr uint32_t kLtAlignment = 16;  // the pointer alignment the cuBLASLt plans are chosen for

void check_size(int64_t n, const char* what) {
  DPTRAIN_CHECK(n <= std::numeric_limits<int>::max(), what, ": ", n, " exceeds cuBLAS/cuDNN's int sizes");
}

}  // namespace

// ---- set-up ----

CudaBackend::CudaBackend(int device_index, CudaOptions options) : index_(device_index), options_(options) {
  try {
    create_resources();
  } catch (...) {
    destroy_resources();
    throw;
  }
}

void CudaBackend::create_resources() {
  DPTRAIN_CUDA_CHECK(cudaSetDevice(index_));
  DPTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  DPTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  DPTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking));
  DPTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  DPTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&in_place_upload_done_, cudaEventDisableTiming));
  for (Pinned* p : {&upload_[0], &upload_[1], &batch_upload_[0], &batch_upload_[1], &download_})
    DPTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
  // Keep what is freed: a steady-state step then reuses the pool's blocks and never asks the driver.
  cudaMemPool_t pool;
  DPTRAIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
  uint64_t keep_everything = std::numeric_limits<uint64_t>::max();
  DPTRAIN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  cudaMemPoolProps upload_props{};
  upload_props.allocType = cudaMemAllocationTypePinned;
  upload_props.location.type = cudaMemLocationTypeDevice;
  upload_props.location.id = index_;
  // A pool of its own is an optimisation: where a virtualised driver refuses one, upload() takes the
  // default pool's path (Backend::upload: the copy then waits for all queued compute) instead of the
  // backend failing.
  if (cudaMemPoolCreate(&upload_pool_, &upload_props) != cudaSuccess) {
    cudaGetLastError();
    upload_pool_ = nullptr;
  } else {
    DPTRAIN_CUDA_CHECK(
        cudaMemPoolSetAttribute(upload_pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  }
  DPTRAIN_CUBLAS_CHECK(cublasCreate(&cublas_));
  DPTRAIN_CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
  // Plain fp32 unless TF32 is asked for: the results then agree with the CPU to float rounding.
  DPTRAIN_CUBLAS_CHECK(
      cublasSetMathMode(cublas_, options_.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  DPTRAIN_CUBLAS_CHECK(cublasLtCreate(&cublas_lt_));
  DPTRAIN_CUDNN_CHECK(cudnnCreate(&cudnn_));
  DPTRAIN_CUDNN_CHECK(cudnnSetStream(cudnn_, compute_));
}

CudaBackend::~CudaBackend() {
  destroy_resources();
}

void CudaBackend::destroy_resources() {
  release_cached();  // the library handles too
  for (Pinned* p : {&upload_[0], &upload_[1], &batch_upload_[0], &batch_upload_[1], &download_}) {
    if (p->done) cudaEventDestroy(p->done);
    p->done = nullptr;
  }
  for (cudaEvent_t* event : {&compute_ready_, &in_place_upload_done_}) {
    if (*event) cudaEventDestroy(*event);
    *event = nullptr;
  }
  // Blocks still allocated (a batch tensor outliving the backend) defer the pool's end to their free.
  if (upload_pool_) cudaMemPoolDestroy(upload_pool_);
  upload_pool_ = nullptr;
  for (cudaStream_t* stream : {&upload_stream_, &copy_, &compute_}) {
    if (*stream) cudaStreamDestroy(*stream);
    *stream = nullptr;
  }
}

void CudaBackend::release_cached() {
  // At exit: nothing useful to do with an error any more, so none is checked. A collective that
  // never finished (a peer died) may hold the streams: then nothing is freed, the exit does it.
  cudaSetDevice(index_);
  if (!settles_within_2s(nullptr)) return;
  conv_plans_.clear();
  linear_plans_.clear();
  // Synchronous frees: the stream-ordered pool would keep the blocks, which compute-sanitizer's leak
  // check then reports.
  for (Scratch* s : {&workspace_, &labels_, &relu_mask_, &row_loss_, &partials_, &flag_, &reduction_}) {
    if (s->data) cudaFree(s->data);
    *s = {};
  }
  for (Pinned* p : {&upload_[0], &upload_[1], &batch_upload_[0], &batch_upload_[1], &download_}) {
    if (p->done) cudaEventSynchronize(p->done);
    if (p->data) cudaFreeHost(p->data);
    p->data = nullptr;
    p->bytes = 0;
  }
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublas_lt_) cublasLtDestroy(cublas_lt_);
  if (cublas_) cublasDestroy(cublas_);
  cudnn_ = nullptr;
  cublas_lt_ = nullptr;
  cublas_ = nullptr;
  cudaStreamSynchronize(compute_);
  // The pools keep every freed block (the release threshold above); hand them back to the driver.
  cudaStreamSynchronize(upload_stream_);
  if (upload_pool_) cudaMemPoolTrimTo(upload_pool_, 0);
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, index_) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
}

bool CudaBackend::settles_within_2s(cudaEvent_t event) const {
  for (int waited_ms = 0; (event && cudaEventQuery(event) == cudaErrorNotReady) ||
                          cudaStreamQuery(compute_) == cudaErrorNotReady;
       ++waited_ms) {
    if (waited_ms == 2000) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Every entry point runs with this backend's GPU current on the calling thread: a process may drive
// several GPUs (the conformance test does), and launches, handles and events belong to one.
void CudaBackend::make_current() const {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != index_) DPTRAIN_CUDA_CHECK(cudaSetDevice(index_));
}

// ---- memory ----

void* CudaBackend::allocate(std::size_t bytes) {
  make_current();
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  DPTRAIN_CUDA_CHECK(malloc_on_compute(&p, bytes));
  return p;
}

// The upload pool keeps the blocks of released batches (its release threshold), and the default pool
// cannot borrow them: out of memory, the idle ones go back to the driver and the allocation is tried
// once more, rather than failing with the memory held there (batches of a larger size late in a run).
cudaError_t CudaBackend::malloc_on_compute(void** p, std::size_t bytes) {
  const cudaError_t status = cudaMallocAsync(p, bytes, compute_);
  if (status != cudaErrorMemoryAllocation || upload_pool_ == nullptr) return status;
  cudaGetLastError();  // out of memory is not sticky
  // A batch released on the compute stream is idle once that stream has passed its release.
  DPTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_));
  DPTRAIN_CUDA_CHECK(cudaStreamSynchronize(upload_stream_));
  DPTRAIN_CUDA_CHECK(cudaMemPoolTrimTo(upload_pool_, 0));
  return cudaMallocAsync(p, bytes, compute_);
}

void CudaBackend::release(void* pointer, std::size_t) {
  make_current();
  // Stream-ordered: the block returns to the pool once the work queued before it has finished.
  if (pointer) cudaFreeAsync(pointer, compute_);
}

void* CudaBackend::scratch(Scratch& s, std::size_t bytes) {
  void* p = try_scratch(s, bytes);
  if (p == nullptr && bytes > 0) DPTRAIN_CUDA_CHECK(cudaErrorMemoryAllocation);
  return p;
}

void* CudaBackend::try_scratch(Scratch& s, std::size_t bytes) {
  if (bytes <= s.bytes) return s.data;
  if (s.data) DPTRAIN_CUDA_CHECK(cudaFreeAsync(s.data, compute_));
  s = {};
  void* p = nullptr;
  if (malloc_on_compute(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky: the caller may try a smaller request
    return nullptr;
  }
  s = {p, bytes};
  return p;
}

double* CudaBackend::reduction_buffer(int64_t doubles) {
  return static_cast<double*>(
      scratch(reduction_, sizeof(double) * static_cast<std::size_t>(std::max<int64_t>(doubles, 1))));
}

void* CudaBackend::pinned(Pinned& p, std::size_t bytes) {
  if (bytes > p.bytes) {
    // Grow geometrically: batch sizes vary (an epoch's last step, evaluation), and each pinned
    // allocation synchronizes the device.
    const std::size_t size = std::max(bytes, 2 * p.bytes);
    DPTRAIN_CUDA_CHECK(cudaEventSynchronize(p.done));  // nothing may still read the old buffer
    if (p.data) DPTRAIN_CUDA_CHECK(cudaFreeHost(p.data));
    p.data = nullptr;
    p.bytes = 0;  // consistent if the allocation below throws
    ++pinned_allocations_;
    DPTRAIN_CUDA_CHECK(cudaMallocHost(&p.data, size));
    p.bytes = size;
  }
  return p.data;
}

// Two pinned buffers in turn: the host fills one while the copy engine may still read the other.
void* CudaBackend::stage(Pinned (&pair)[2], int& next, const void* host_src, std::size_t bytes) {
  Pinned& slot = pair[next];
  next ^= 1;
  DPTRAIN_CUDA_CHECK(cudaEventSynchronize(slot.done));
  void* staging = pinned(slot, bytes);
  std::memcpy(staging, host_src, bytes);
  return staging;
}

void CudaBackend::copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
  make_current();
  if (bytes == 0) return;
  Pinned& slot = upload_[next_upload_];
  void* staging = stage(upload_, next_upload_, host_src, bytes);
  // `dst` is ordered on the compute stream (allocated or last used there): the copy waits for it,
  // and the compute stream waits for the copy.
  DPTRAIN_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_));
  DPTRAIN_CUDA_CHECK(cudaStreamWaitEvent(copy_, compute_ready_, 0));
  DPTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, staging, bytes, cudaMemcpyHostToDevice, copy_));
  DPTRAIN_CUDA_CHECK(cudaEventRecord(slot.done, copy_));
  DPTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, slot.done, 0));
}

void* CudaBackend::upload(const void* host_src, std::size_t bytes) {
  make_current();
  if (bytes == 0) return nullptr;
  if (upload_pool_ == nullptr) return Backend::upload(host_src, bytes);
  // A block of the upload pool, free in upload_stream_'s order: a batch released by the compute
  // stream (its last reader) becomes reusable once that stream passes the release, so the copy waits
  // for the step that read it, not for everything queued since. Neither pool lends the other its
  // cached blocks: where the device is full of the default pool's (a larger evaluation batch late in
  // a run), the batch takes the default pool's path instead of failing.
  void* dst = nullptr;
  if (cudaMallocFromPoolAsync(&dst, bytes, upload_pool_, upload_stream_) != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky
    return Backend::upload(host_src, bytes);
  }
  try {
    // Page-locked memory of allocate_host()'s is read in place: the host thread copies nothing, and
    // its owner rewrites it only after wait_for_uploads().
    cudaEvent_t done = in_place_upload_done_;
    const void* source = host_src;
    if (in_host_block(host_src, bytes)) {
      ++in_place_uploads_;
    } else {
      done = batch_upload_[next_batch_upload_].done;
      source = stage(batch_upload_, next_batch_upload_, host_src, bytes);
    }
    DPTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, source, bytes, cudaMemcpyHostToDevice, upload_stream_));
    DPTRAIN_CUDA_CHECK(cudaEventRecord(done, upload_stream_));
    DPTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, done, 0));
  } catch (...) {
    cudaFreeAsync(dst, upload_stream_);
    throw;
  }
  DPTRAIN_CUDA_SYNC_POINT("upload (cudaMemcpyAsync on the upload stream)");
  return dst;
}

void* CudaBackend::allocate_host(std::size_t bytes) {
  make_current();
  void* p = nullptr;
  // Page-locked memory is an optimisation: where the host has none left, plain memory serves and
  // upload() stages it as any other.
  if (cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)) != cudaSuccess) {
    cudaGetLastError();
    return Backend::allocate_host(bytes);
  }
  std::lock_guard lock(host_blocks_mutex_);
  host_blocks_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  return p;
}

void CudaBackend::release_host(void* pointer) {
  if (pointer == nullptr) return;
  {
    std::lock_guard lock(host_blocks_mutex_);
    if (host_blocks_.erase(reinterpret_cast<std::uintptr_t>(pointer)) == 0)
      return Backend::release_host(pointer);
  }
  // Called by destructors, also while an error unwinds: nothing is thrown, and nothing waits without
  // end. A copy may still read the block, and freeing page-locked memory waits for the device: with
  // the streams still busy after 2 s (a collective whose peer died, say) the block is left to the
  // exit, as release_cached() leaves its buffers.
  if (cudaSetDevice(index_) != cudaSuccess) return static_cast<void>(cudaGetLastError());
  if (!settles_within_2s(in_place_upload_done_)) return;
  if (cudaFreeHost(pointer) != cudaSuccess) cudaGetLastError();
}

void CudaBackend::wait_for_uploads() {
  make_current();
  DPTRAIN_CUDA_CHECK(cudaEventSynchronize(in_place_upload_done_));
}

bool CudaBackend::in_host_block(const void* host_src, std::size_t bytes) {
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(host_src);
  std::lock_guard lock(host_blocks_mutex_);
  auto block = host_blocks_.upper_bound(begin);
  if (block == host_blocks_.begin()) return false;
  --block;
  return begin + bytes <= block->first + block->second;
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  make_current();
  if (bytes == 0) return;
  void* staging = pinned(download_, bytes);
  DPTRAIN_CUDA_CHECK(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToHost, compute_));
  DPTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_));
  std::memcpy(host_dst, staging, bytes);
}

void CudaBackend::copy(void* dst, const void* src, std::size_t bytes) {
  make_current();
  if (bytes == 0) return;
  DPTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_));
}

void CudaBackend::fill(float* dst, int64_t n, float value) {
  make_current();
  cuda::fill(dst, n, value, compute_);
}

void CudaBackend::synchronize() {
  make_current();
  DPTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

// ---- dense algebra: row-major tensors are column-major transposes, so Y = A B is Y^T = B^T A^T ----

void CudaBackend::matmul(const float* a, const float* b, float* y, MatmulShape s) {
  make_current();
  check_size(s.m * s.k + s.k * s.n, "matmul");
  // cuBLAS refuses leading dimensions of 0: empty shapes are settled here.
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) return cuda::fill(y, s.m * s.n, 0.0f, compute_);
  const float one = 1, zero = 0;
  const int m = static_cast<int>(s.m), k = static_cast<int>(s.k), n = static_cast<int>(s.n);
  DPTRAIN_CUBLAS_CHECK(
      cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, n, a, k, &zero, y, n));
}

void CudaBackend::matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb,
                                  MatmulShape s) {
  make_current();
  if (s.m == 0 || s.k == 0 || s.n == 0) return;  // nothing to add
  const float one = 1;
  const int m = static_cast<int>(s.m), k = static_cast<int>(s.k), n = static_cast<int>(s.n);
  // ga [m, k] += gy [m, n] b^T: ga^T = b gy^T.
  if (ga)
    DPTRAIN_CUBLAS_CHECK(
        cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, k, m, n, &one, b, n, gy, n, &one, ga, k));
  // gb [k, n] += a^T gy: gb^T = gy^T a.
  if (gb)
    DPTRAIN_CUBLAS_CHECK(
        cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, n, k, m, &one, gy, n, a, k, &one, gb, n));
}

struct CudaBackend::LinearPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulHeuristicResult_t algo{};
  bool usable = false;  // a bias-epilogue algorithm exists for this shape
  ~LinearPlan() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (cublasLtMatrixLayout_t l : {w, x, y})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

// y^T [out, batch] = W [out, in] x^T: in column-major terms op(A) = A^T with A the stored [in, out]
// weight, B the stored [in, batch] input; the bias (length out) goes into the GEMM's epilogue.
CudaBackend::LinearPlan& CudaBackend::linear_plan(LinearShape s) {
  auto& plan = linear_plans_[{s.batch, s.in, s.out, options_.tf32}];
  if (plan) return *plan;
  plan = std::make_unique<LinearPlan>();
  const cublasComputeType_t compute = options_.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DPTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  DPTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  DPTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  DPTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  DPTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->w, CUDA_R_32F, s.in, s.out, s.in));
  DPTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->x, CUDA_R_32F, s.in, s.batch, s.in));
  DPTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->y, CUDA_R_32F, s.out, s.batch, s.out));
  cublasLtMatmulPreference_t preference;
  DPTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const std::size_t workspace = 32 << 20;
  DPTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  // Parameters are windows of the flat buffers, aligned to 64 bytes, not cuBLASLt's assumed 256.
  const uint32_t alignment = kLtAlignment;
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    DPTRAIN_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment));
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      cublas_lt_, plan->op, plan->w, plan->x, plan->y, plan->y, preference, 1, &plan->algo, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  plan->usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
  return *plan;
}

void CudaBackend::linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) {
  make_current();
  check_size(s.batch * s.in + s.out * s.in, "linear");
  if (s.batch == 0 || s.out == 0) return;
  if (s.in == 0) {  // y = bias (or zero) broadcast: cuBLAS refuses leading dimensions of 0
    cuda::fill(y, s.batch * s.out, 0.0f, compute_);
    if (bias) cuda::add_bias(y, bias, y, {s.batch, s.out, 1}, /*relu=*/false, compute_);
    return;
  }
  const float one = 1, zero = 0;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kLtAlignment == 0; };
  if (bias && aligned(x) && aligned(w) && aligned(y) && aligned(bias)) {
    LinearPlan& plan = linear_plan(s);
    if (plan.usable) {
      DPTRAIN_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      void* workspace = scratch(workspace_, plan.algo.workspaceSize);
      DPTRAIN_CUBLAS_CHECK(cublasLtMatmul(cublas_lt_, plan.op, &one, w, plan.w, x, plan.x, &zero, y, plan.y,
                                          y, plan.y, &plan.algo.algo, workspace, plan.algo.workspaceSize,
                                          compute_));
      return;
    }
  }
  const int batch = static_cast<int>(s.batch), in = static_cast<int>(s.in), out = static_cast<int>(s.out);
  DPTRAIN_CUBLAS_CHECK(
      cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, out, batch, in, &one, w, in, x, in, &zero, y, out));
  if (bias) cuda::add_bias(y, bias, y, {s.batch, s.out, 1}, /*relu=*/false, compute_);
}

void CudaBackend::linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw,
                                  float* gbias, LinearShape s) {
  make_current();
  if (s.batch == 0 || s.out == 0) return;  // no gradient flows
  if (gbias) bias_gradient(gy, gbias, {s.batch, s.out, 1}, nullptr, compute_);
  if (s.in == 0) return;
  const float one = 1;
  const int batch = static_cast<int>(s.batch), in = static_cast<int>(s.in), out = static_cast<int>(s.out);
  // gx [batch, in] += gy [batch, out] w [out, in]: gx^T = w^T gy^T.
  if (gx)
    DPTRAIN_CUBLAS_CHECK(
        cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, in, batch, out, &one, w, in, gy, out, &one, gx, in));
  // gw [out, in] += gy^T x: gw^T = x^T gy.
  if (gw)
    DPTRAIN_CUBLAS_CHECK(
        cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, batch, &one, x, in, gy, out, &one, gw, in));
}

void CudaBackend::add_bias(const float* x, const float* bias, float* y, BiasShape s) {
  make_current();
  cuda::add_bias(x, bias, y, s, /*relu=*/false, compute_);
}

void CudaBackend::add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) {
  make_current();
  if (gx) cuda::add(gy, gx, s.outer * s.channels * s.inner, compute_);
  if (gbias) bias_gradient(gy, gbias, s, reduction_buffer(bias_gradient_partials(s)), compute_);
}

// ---- convolution (cuDNN), one plan per shape ----

// One of cuDNN's algorithms for one direction of a convolution, with the math type and workspace it
// was offered with.
struct ConvAlgorithm {
  int algo = 0;
  cudnnMathType_t math{};
  std::size_t workspace = 0;
};

struct CudaBackend::ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  // Each direction's candidates in rank order, and the first that has worked: one that fails at run
  // time (not supported after all, no memory for its workspace) is passed over for the next.
  std::vector<ConvAlgorithm> forward, backward_data, backward_filter;
  std::size_t forward_at = 0, data_at = 0, filter_at = 0;
  ~ConvPlan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

namespace {

// cuDNN's candidates in its order (the heuristics' ranking, or the timings' with cudnnFind), less
// those that need more than the workspace cap or, when asked, are not deterministic.
template <typename Perf>
std::vector<ConvAlgorithm> usable(const Perf* results, int count, bool deterministic, const char* what) {
  std::vector<ConvAlgorithm> out;
  for (int i = 0; i < count; ++i) {
    const Perf& p = results[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspace) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    out.push_back({static_cast<int>(p.algo), p.mathType, p.memory});
  }
  DPTRAIN_CHECK(!out.empty(), "cuDNN offers no ", deterministic ? "deterministic " : "", what,
                " algorithm for this convolution within ", kMaxWorkspace >> 20, " MiB of workspace",
                deterministic ? "; set cuda.deterministic to false" : "");
  return out;
}

}  // namespace

CudaBackend::ConvPlan& CudaBackend::conv_plan(const Conv2dGeometry& g) {
  const auto key = std::make_tuple(g.batch, g.channels, g.height, g.width, g.out_channels, g.kernel_h,
                                   g.kernel_w, g.stride, g.padding);
  if (const auto found = conv_plans_.find(key); found != conv_plans_.end()) return *found->second;
  check_size(g.batch * g.channels * g.height * g.width, "conv2d input");
  check_size(g.batch * g.out_channels * g.out_h * g.out_w, "conv2d output");
  // Built aside and kept only once complete: a shape whose algorithms cannot be chosen stays unplanned.
  auto plan = std::make_unique<ConvPlan>();
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  DPTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  DPTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(g.batch),
                                                 i(g.channels), i(g.height), i(g.width)));
  DPTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  DPTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(g.batch),
                                                 i(g.out_channels), i(g.out_h), i(g.out_w)));
  DPTRAIN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  DPTRAIN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                 i(g.out_channels), i(g.channels), i(g.kernel_h),
                                                 i(g.kernel_w)));
  DPTRAIN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  // PyTorch's Conv2d is a cross-correlation.
  DPTRAIN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, g.padding, g.padding, g.stride, g.stride, 1,
                                                      1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // FMA math: no TF32 tensor cores (cuDNN's default math uses them for fp32 on Ampere and later).
  DPTRAIN_CUDNN_CHECK(
      cudnnSetConvolutionMathType(plan->conv, options_.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));

  constexpr int kCandidates = 16;
  const bool deterministic = options_.deterministic;
  int count = 0;
  cudnnConvolutionFwdAlgoPerf_t forward[kCandidates];
  cudnnConvolutionBwdDataAlgoPerf_t data[kCandidates];
  cudnnConvolutionBwdFilterAlgoPerf_t filter[kCandidates];
  // cudnnFind times each algorithm on buffers of its own (cuda.cudnn_benchmark); the heuristics only
  // rank them.
  if (options_.cudnn_benchmark) {
    DPTRAIN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(cudnn_, plan->x, plan->w, plan->conv, plan->y,
                                                             kCandidates, &count, forward));
    plan->forward = usable(forward, count, deterministic, "forward");
    DPTRAIN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(cudnn_, plan->w, plan->y, plan->conv,
                                                                  plan->x, kCandidates, &count, data));
    plan->backward_data = usable(data, count, deterministic, "backward-data");
    DPTRAIN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(cudnn_, plan->x, plan->y, plan->conv,
                                                                    plan->w, kCandidates, &count, filter));
    plan->backward_filter = usable(filter, count, deterministic, "backward-filter");
  } else {
    DPTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, plan->x, plan->w, plan->conv, plan->y,
                                                               kCandidates, &count, forward));
    plan->forward = usable(forward, count, deterministic, "forward");
    DPTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, plan->w, plan->y, plan->conv,
                                                                    plan->x, kCandidates, &count, data));
    plan->backward_data = usable(data, count, deterministic, "backward-data");
    DPTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn_, plan->x, plan->y, plan->conv,
                                                                      plan->w, kCandidates, &count, filter));
    plan->backward_filter = usable(filter, count, deterministic, "backward-filter");
  }
  return *conv_plans_.emplace(key, std::move(plan)).first->second;
}

// Runs `call(algorithm, workspace)` with the plan's first working candidate, and passes over any that
// fails for the next in rank, unless the call `adds_into_output` (beta 1) and may have done so in part.
template <typename Call>
void CudaBackend::run_ranked(ConvPlan& plan, std::vector<ConvAlgorithm>& candidates, std::size_t& at,
                             const char* what, bool adds_into_output, Call call) {
  at = first_working(
      candidates.size(), at, std::string("cuDNN ") + what,
      "the convolution cannot run on this GPU as configured; try cuda.deterministic false or "
      "a smaller batch",
      [&](std::size_t k) -> std::string {
        const ConvAlgorithm& a = candidates[k];
        const std::string name = "algorithm " + std::to_string(a.algo);
        void* workspace = try_scratch(workspace_, a.workspace);
        if (a.workspace > 0 && workspace == nullptr)
          return name + ": no memory for its " + std::to_string(a.workspace >> 20) + " MiB workspace";
        cudnnStatus_t status = cudnnSetConvolutionMathType(plan.conv, a.math);
        if (status == CUDNN_STATUS_SUCCESS) status = call(a, workspace);
        if (status == CUDNN_STATUS_SUCCESS) return {};
        cudaGetLastError();  // a failed launch inside cuDNN must not be blamed on the next
        const std::string failure = name + ": " + cudnnGetErrorString(status);
        DPTRAIN_CHECK(!adds_into_output || cudnn_failed_before_writing(status), "cuDNN ", what, " ", failure,
                      " (status ", static_cast<int>(status),
                      ") after it may have added part of its result into the gradient, which "
                      "another algorithm would add to again; the GPU failed or ran out of memory "
                      "inside cuDNN: check nvidia-smi, then resume from the last checkpoint");
        return failure;
      });
  DPTRAIN_CUDA_SYNC_POINT(what);
}

void CudaBackend::conv2d(const float* x, const float* w, const float* bias, float* y,
                         const Conv2dGeometry& g) {
  make_current();
  if (g.batch == 0) return;
  ConvPlan& plan = conv_plan(g);
  const float one = 1, zero = 0;
  run_ranked(plan, plan.forward, plan.forward_at, "cudnnConvolutionForward", /*adds_into_output=*/false,
             [&](const ConvAlgorithm& a, void* workspace) {
               return cudnnConvolutionForward(cudnn_, &one, plan.x, x, plan.w, w, plan.conv,
                                              static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), workspace,
                                              a.workspace, &zero, plan.y, y);
             });
  // The bias and the fused ReLU in one pass over the output.
  if (bias || g.fuse_relu)
    cuda::add_bias(y, bias, y, {g.batch, g.out_channels, g.out_h * g.out_w}, g.fuse_relu, compute_);
}

void CudaBackend::conv2d_backward(const float* gy, const float* x, const float* w, const float* y,
                                  GradientOut gx, float* gw, float* gbias, const Conv2dGeometry& g) {
  make_current();
  if (g.batch == 0) return;
  ConvPlan& plan = conv_plan(g);
  const int64_t n = g.batch * g.out_channels * g.out_h * g.out_w;
  const float* grad = gy;
  if (g.fuse_relu) {  // the gradient passes where the output is positive
    float* masked = static_cast<float*>(scratch(relu_mask_, sizeof(float) * n));
    relu_mask(gy, y, masked, n, compute_);
    grad = masked;
  }
  if (gbias) {
    const BiasShape shape{g.batch, g.out_channels, g.out_h * g.out_w};
    bias_gradient(grad, gbias, shape, reduction_buffer(bias_gradient_partials(shape)), compute_);
  }
  const float one = 1;
  if (gw)
    run_ranked(plan, plan.backward_filter, plan.filter_at, "cudnnConvolutionBackwardFilter",
               /*adds_into_output=*/true, [&](const ConvAlgorithm& a, void* workspace) {
                 return cudnnConvolutionBackwardFilter(cudnn_, &one, plan.x, x, plan.y, grad, plan.conv,
                                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo),
                                                       workspace, a.workspace, &one, plan.w, gw);
               });
  // beta 0 where gx is to be written: cuDNN then does not read it (a new buffer holds garbage).
  const float zero = 0;
  const float* keep_gx = gx.overwrite ? &zero : &one;
  if (gx)
    run_ranked(plan, plan.backward_data, plan.data_at, "cudnnConvolutionBackwardData", !gx.overwrite,
               [&](const ConvAlgorithm& a, void* workspace) {
                 return cudnnConvolutionBackwardData(cudnn_, &one, plan.w, w, plan.y, grad, plan.conv,
                                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo),
                                                     workspace, a.workspace, keep_gx, plan.x, gx.data);
               });
}

// ---- pooling and pointwise: cuda/kernels.cu ----

void CudaBackend::maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) {
  make_current();
  cuda::maxpool2d(x, y, argmax, g, compute_);
}
void CudaBackend::maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                                     const Pool2dGeometry& g) {
  make_current();
  cuda::maxpool2d_backward(gy, argmax, gx, g, compute_);
}
void CudaBackend::conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y,
                                               const float* x, const float* w, GradientOut gx, float* gw,
                                               float* gbias, const ConvPoolGeometry& g) {
  make_current();
  if (g.conv.batch == 0) return;
  // The conv output's gradient comes masked already: the convolution's backward runs without ReLU,
  // so relu_mask_ (used only with it) holds that gradient meanwhile.
  const int64_t n = g.conv.batch * g.conv.out_channels * g.conv.pixels();
  float* gconv = static_cast<float*>(scratch(relu_mask_, sizeof(float) * n));
  cuda::maxpool_relu_backward(gy, argmax, y, gconv, g.pool, compute_);
  Conv2dGeometry unmasked = g.conv;
  unmasked.fuse_relu = false;
  conv2d_backward(gconv, x, w, nullptr, gx, gw, gbias, unmasked);
}
void CudaBackend::batchnorm_sums(const float* x, double* sums, BatchNormShape s) {
  make_current();
  cuda::batchnorm_sums(x, sums, s, reduction_buffer(batchnorm_partials(s)), compute_);
}
void CudaBackend::batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) {
  make_current();
  cuda::batchnorm_squares(x, sums, squares, s, reduction_buffer(batchnorm_partials(s)), compute_);
}
void CudaBackend::batchnorm_batch_stats(const double* sums, const double* squares, float* stats,
                                        float* running_mean, float* running_var, int64_t channels, float eps,
                                        float momentum) {
  make_current();
  cuda::batchnorm_batch_stats(sums, squares, stats, running_mean, running_var, channels, eps, momentum,
                              compute_);
}
void CudaBackend::batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                                          int64_t channels, float eps) {
  make_current();
  cuda::batchnorm_running_stats(running_mean, running_var, stats, channels, eps, compute_);
}
void CudaBackend::batchnorm_normalize(const float* x, const float* stats, const float* gamma,
                                      const float* beta, float* y, BatchNormShape s,
                                      BatchNormEpilogue epilogue) {
  make_current();
  cuda::batchnorm_normalize(x, stats, gamma, beta, y, s, epilogue, compute_);
}
void CudaBackend::batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x,
                                            const float* stats, double* grad_sums, float* ggamma,
                                            float* gbeta, GradientOut gresidual, BatchNormShape s) {
  make_current();
  cuda::batchnorm_backward_reduce(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, s,
                                  reduction_buffer(batchnorm_partials(s)), compute_);
}
void CudaBackend::batchnorm_backward_input(const float* gy, const float* relu_y, const float* x,
                                           const float* stats, const float* gamma, const double* grad_sums,
                                           const double* sums, GradientOut gx, BatchNormShape s) {
  make_current();
  cuda::batchnorm_backward_input(gy, relu_y, x, stats, gamma, grad_sums, sums, gx, s, compute_);
}
void CudaBackend::mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) {
  make_current();
  cuda::mean_planes(x, y, planes, plane_size, compute_);
}
void CudaBackend::mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size) {
  make_current();
  cuda::mean_planes_backward(gy, gx, planes, plane_size, compute_);
}
void CudaBackend::activation(Activation f, const float* x, float* y, int64_t n) {
  make_current();
  cuda::activation(f, x, y, n, compute_);
}
void CudaBackend::activation_backward(Activation f, const float* x, const float* y, const float* gy,
                                      float* gx, int64_t n) {
  make_current();
  cuda::activation_backward(f, x, y, gy, gx, n, compute_);
}
void CudaBackend::dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state) {
  make_current();
  cuda::dropout(x, y, mask, n, p, rng_state, compute_);
}
void CudaBackend::dropout_backward(const float* gy, const float* mask, float* gx, int64_t n) {
  make_current();
  cuda::dropout_backward(gy, mask, gx, n, compute_);
}
void CudaBackend::add(const float* x, float* y, int64_t n) {
  make_current();
  cuda::add(x, y, n, compute_);
}
void CudaBackend::add_scalar(float* y, int64_t n, float value) {
  make_current();
  cuda::add_scalar(y, n, value, compute_);
}

// ---- losses and reductions ----

const int32_t* CudaBackend::upload_labels(std::span<const int32_t> labels) {
  auto* device_labels =
      static_cast<int32_t*>(scratch(labels_, sizeof(int32_t) * std::max<std::size_t>(labels.size(), 1)));
  copy_from_host(device_labels, labels.data(), labels.size_bytes());
  return device_labels;
}

void CudaBackend::cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs,
                                float* loss, int64_t batch, int64_t classes) {
  make_current();
  const int32_t* device_labels = upload_labels(labels);
  auto* row_loss = static_cast<float*>(scratch(row_loss_, sizeof(float) * batch));
  softmax_cross_entropy(logits, device_labels, probs, row_loss, batch, classes, compute_);
  reduce_sum(row_loss, nullptr, batch, 1.0 / static_cast<double>(batch),
             static_cast<double*>(scratch(partials_, sizeof(double) * kReductionBlocks)), loss, compute_);
}

void CudaBackend::cross_entropy_backward(const float* probs, std::span<const int32_t> labels,
                                         const float* gloss, float* glogits, int64_t batch, int64_t classes) {
  make_current();
  // Uploaded again: another forward (an evaluation) may have replaced the forward's labels since.
  cuda::cross_entropy_backward(probs, upload_labels(labels), gloss, glogits, batch, classes, compute_);
}

void CudaBackend::mse(const float* prediction, const float* target, float* loss, int64_t n) {
  make_current();
  reduce_sum(prediction, target, n, 1.0 / static_cast<double>(n),
             static_cast<double*>(scratch(partials_, sizeof(double) * kReductionBlocks)), loss, compute_);
}

void CudaBackend::mse_backward(const float* prediction, const float* target, const float* gloss,
                               float* gprediction, int64_t n) {
  make_current();
  cuda::mse_backward(prediction, target, gloss, gprediction, n, compute_);
}

void CudaBackend::sum(const float* x, float* out, int64_t n) {
  make_current();
  reduce_sum(x, nullptr, n, 1.0, static_cast<double*>(scratch(partials_, sizeof(double) * kReductionBlocks)),
             out, compute_);
}

void CudaBackend::sum_backward(const float* gout, float* gx, int64_t n) {
  make_current();
  add_device_scalar(gout, gx, n, compute_);
}

// ---- gradient reduction and optimizers ----

void CudaBackend::to_half(const float* x, uint16_t* y, int64_t n, float scale, HalfFormat format) {
  make_current();
  floats_to_halves(x, y, n, scale, format, compute_);
}

void CudaBackend::from_half(const uint16_t* x, float* y, int64_t n, HalfFormat format) {
  make_current();
  halves_to_floats(x, y, n, format, compute_);
}

bool CudaBackend::all_finite(const float* x, int64_t n) {
  make_current();
  auto* flag = static_cast<int32_t*>(scratch(flag_, sizeof(int32_t)));
  DPTRAIN_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int32_t), compute_));
  flag_non_finite(x, n, flag, compute_);
  int32_t bad = 0;
  copy_to_host(&bad, flag, sizeof bad);
  return bad == 0;
}

// The block partials on the device, added on the host in block order: the same bits for a given n.
double CudaBackend::sum_of_squares(const float* x, int64_t n) {
  make_current();
  auto* partials = static_cast<double*>(scratch(partials_, sizeof(double) * kReductionBlocks));
  const int count = cuda::sum_of_squares_partials(x, n, partials, compute_);
  double host[kReductionBlocks];
  copy_to_host(host, partials, sizeof(double) * static_cast<std::size_t>(count));
  double sum = 0;
  for (int b = 0; b < count; ++b) sum += host[b];
  return sum;
}

void CudaBackend::mark_non_finite(const float* x, int64_t n, int32_t* flag, int32_t value) {
  make_current();
  cuda::mark_non_finite(x, n, flag, value, compute_);
}

void CudaBackend::count_correct(const float* logits, std::span<const int32_t> labels, int64_t classes,
                                float* out) {
  make_current();
  if (labels.empty()) return cuda::fill(out, 1, 0.0f, compute_);
  cuda::count_correct(logits, upload_labels(labels), static_cast<int64_t>(labels.size()), classes, out,
                      compute_);
}

void CudaBackend::sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n,
                           const SgdStep& s) {
  make_current();
  cuda::sgd_step(params, grads, momentum_buffer, n, s, compute_);
}

void CudaBackend::adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                            const AdamStep& s) {
  make_current();
  cuda::adam_step(params, grads, exp_avg, exp_avg_sq, n, s, compute_);
}

}  // namespace dptrain::cuda
