// The CUDA backend: the Backend table (core/backend.h) on one GPU. Dense algebra on cuBLAS (cuBLASLt
// with the bias in the GEMM's epilogue for linear), convolutions on cuDNN 9's convolution API with
// algorithms chosen once per shape, everything else on the kernels of cuda/kernels.cu. Work runs
// in order on one compute stream; host-to-device copies go through two pinned buffers on a copy
// stream, asynchronously for the host (which fills the next buffer meanwhile), ordered after the
// compute work queued before them and before the work queued after. upload() (a batch) has a stream,
// a pair of pinned buffers and a memory pool of its own, so that its copy waits only for the release
// of an earlier upload, not for the compute queued before it (nor, through the copy stream's order,
// for a label copy that waits for it): the next batch's copy overlaps the step before, and reads a
// loader slot of allocate_host()'s in place instead of through the pinned pair. Memory is
// stream-ordered (cudaMallocAsync on a pool that keeps what is freed), so a steady-state step calls
// the driver's allocator zero times and a block is reused only in stream order.
// Internal to cuda/: the trainer reaches it through backend_for(Device::cuda(i)).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "cuda/check.h"

namespace dptrain::cuda {

struct CudaOptions {
  bool tf32 = false;             // TF32 tensor cores for fp32 GEMMs and convolutions (off: exact fp32)
  bool deterministic = false;    // only cuDNN algorithms that give the same bits run to run
  bool cudnn_benchmark = false;  // rank cuDNN's algorithms by timing them (cudnnFind), not heuristics
};

struct ConvAlgorithm;  // one of cuDNN's algorithms for a convolution (backend.cpp)

class CudaBackend final : public Backend {
 public:
  // Makes `device_index` current on this thread and sets up streams, handles and the memory pool.
  CudaBackend(int device_index, CudaOptions options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda(index_); }
  // Frees what the backend keeps between calls (scratch, pinned staging, the cuBLAS and cuDNN
  // handles and their workspaces) once the queued work is done. At exit (cuda/runtime.cpp), so that
  // compute-sanitizer's leak check sees only real leaks; buffers may still be released after it,
  // but no op may run.
  void release_cached() override;
  cudaStream_t compute_stream() const { return compute_; }
  const CudaOptions& options() const { return options_; }
  // How many times a pinned staging buffer was allocated (each one synchronizes the device).
  int pinned_allocations() const { return pinned_allocations_; }
  // How many upload() calls read a block of allocate_host()'s in place, without staging.
  int in_place_uploads() const { return in_place_uploads_; }

  void* allocate(std::size_t bytes) override;
  void release(void* pointer, std::size_t bytes) override;
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override;
  void* upload(const void* host_src, std::size_t bytes) override;
  void* allocate_host(std::size_t bytes) override;
  void release_host(void* pointer) override;
  void wait_for_uploads() override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void fill(float* dst, int64_t n, float value) override;
  void synchronize() override;

  void matmul(const float* a, const float* b, float* y, MatmulShape s) override;
  void matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb,
                       MatmulShape s) override;
  void linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) override;
  void linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw, float* gbias,
                       LinearShape s) override;
  void add_bias(const float* x, const float* bias, float* y, BiasShape s) override;
  void add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) override;
  void conv2d(const float* x, const float* w, const float* bias, float* y, const Conv2dGeometry& g) override;
  void conv2d_backward(const float* gy, const float* x, const float* w, const float* y, GradientOut gx,
                       float* gw, float* gbias, const Conv2dGeometry& g) override;
  void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) override;
  void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                          const Pool2dGeometry& g) override;
  // The pooling and ReLU backward in one kernel (cuda::maxpool_relu_backward), then the convolution's.
  void conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y, const float* x,
                                    const float* w, GradientOut gx, float* gw, float* gbias,
                                    const ConvPoolGeometry& g) override;
  void batchnorm_sums(const float* x, double* sums, BatchNormShape s) override;
  void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) override;
  void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                             float* running_var, int64_t channels, float eps, float momentum) override;
  void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                               int64_t channels, float eps) override;
  void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta,
                           float* y, BatchNormShape s, BatchNormEpilogue epilogue) override;
  void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                                 double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                                 BatchNormShape s) override;
  void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                                const float* gamma, const double* grad_sums, const double* sums,
                                GradientOut gx, BatchNormShape s) override;
  void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) override;
  void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size) override;
  void activation(Activation f, const float* x, float* y, int64_t n) override;
  void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx,
                           int64_t n) override;
  void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state) override;
  void dropout_backward(const float* gy, const float* mask, float* gx, int64_t n) override;
  void add(const float* x, float* y, int64_t n) override;
  void add_scalar(float* y, int64_t n, float value) override;
  void cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs, float* loss,
                     int64_t batch, int64_t classes) override;
  void cross_entropy_backward(const float* probs, std::span<const int32_t> labels, const float* gloss,
                              float* glogits, int64_t batch, int64_t classes) override;
  void mse(const float* prediction, const float* target, float* loss, int64_t n) override;
  void mse_backward(const float* prediction, const float* target, const float* gloss, float* gprediction,
                    int64_t n) override;
  void sum(const float* x, float* out, int64_t n) override;
  void sum_backward(const float* gout, float* gx, int64_t n) override;
  void to_half(const float* x, uint16_t* y, int64_t n, float scale, HalfFormat format) override;
  void from_half(const uint16_t* x, float* y, int64_t n, HalfFormat format) override;
  bool all_finite(const float* x, int64_t n) override;
  double sum_of_squares(const float* x, int64_t n) override;
  void mark_non_finite(const float* x, int64_t n, int32_t* flag, int32_t value) override;
  void count_correct(const float* logits, std::span<const int32_t> labels, int64_t classes,
                     float* out) override;
  void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n,
                const SgdStep& s) override;
  void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const AdamStep& s) override;

 private:
  // A device buffer of this backend that grows and is kept (scratch: workspaces, labels, masks).
  struct Scratch {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  void make_current() const;
  // Whether the compute stream (and `event`, where given) finished within 2 s: releases at exit and
  // while an error unwinds wait that long, no longer, for work a dead peer may never let finish.
  bool settles_within_2s(cudaEvent_t event) const;
  // The streams, events, pools and library handles: made by the constructor, released by the
  // destructor, and by the constructor itself when one of them fails (no destructor runs then).
  void create_resources();
  void destroy_resources();
  // cudaMallocAsync on the compute stream, retried once after trimming the upload pool.
  cudaError_t malloc_on_compute(void** p, std::size_t bytes);
  void* scratch(Scratch& s, std::size_t bytes);
  // As scratch, but null where the memory is not to be had (the caller has another way).
  void* try_scratch(Scratch& s, std::size_t bytes);
  // Partial sums of the deterministic two-pass reductions (batch normalisation, bias gradients).
  double* reduction_buffer(int64_t doubles);
  // A pinned host buffer that grows; `done` is recorded after the last copy that used it.
  struct Pinned {
    void* data = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  void* pinned(Pinned& p, std::size_t bytes);
  // The next of a pair of pinned buffers, once the copy that last read it is done, holding `bytes`
  // of host memory.
  void* stage(Pinned (&pair)[2], int& next, const void* host_src, std::size_t bytes);
  const int32_t* upload_labels(std::span<const int32_t> labels);
  // Whether [host_src, host_src + bytes) lies in one block of allocate_host()'s.
  bool in_host_block(const void* host_src, std::size_t bytes);

  struct ConvPlan;  // descriptors and algorithms of one convolution shape
  ConvPlan& conv_plan(const Conv2dGeometry& g);
  template <typename Call>
  void run_ranked(ConvPlan& plan, std::vector<ConvAlgorithm>& candidates, std::size_t& at, const char* what,
                  bool adds_into_output, Call call);
  struct LinearPlan;  // cuBLASLt descriptors and algorithm of one linear shape
  LinearPlan& linear_plan(LinearShape s);

  int index_;
  CudaOptions options_;
  cudaStream_t compute_ = nullptr, copy_ = nullptr, upload_stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;  // "work enqueued so far" marker for the copy stream
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  Scratch workspace_, labels_, relu_mask_, row_loss_, partials_, flag_, reduction_;
  Pinned upload_[2], batch_upload_[2], download_;
  int next_upload_ = 0, next_batch_upload_ = 0;
  cudaMemPool_t upload_pool_ = nullptr;  // upload()'s blocks, allocated in upload_stream_'s order
  // allocate_host()'s blocks by address, and the last upload() that read one in place.
  std::mutex host_blocks_mutex_;
  std::map<std::uintptr_t, std::size_t> host_blocks_;
  cudaEvent_t in_place_upload_done_ = nullptr;
  int pinned_allocations_ = 0, in_place_uploads_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>,
           std::unique_ptr<ConvPlan>>
      conv_plans_;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::unique_ptr<LinearPlan>> linear_plans_;
};

}  // namespace dptrain::cuda
