// Return-code checks for the CUDA runtime, cuBLAS, cuDNN and NCCL: a failed call throws
// dptrain::Error naming the call, its error string and file:line; main() adds the rank. A failed
// runtime call also clears the runtime's last error, so that the next launch check does not blame
// the wrong call. Internal to cuda/ (it brings the CUDA headers).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "core/error.h"

namespace dptrain::cuda::detail {
[[noreturn]] void fail_call(const char* call, const std::string& error, const char* file, int line);
[[noreturn]] void fail_cuda(cudaError_t status, const char* call, const char* file, int line);
const char* cublas_status_name(cublasStatus_t status);
// DPTRAIN_CUDA_SYNC=1 (read once): the device is synchronized and checked after every launch and
// library call, so that an asynchronous fault (an illegal address, a failed kernel inside cuDNN) is
// blamed on the op that caused it rather than on a later copy. For debugging: it serialises
// everything.
bool sync_each_op();
void synchronize_after(const char* call, const char* file, int line);
}  // namespace dptrain::cuda::detail

#define DPTRAIN_CUDA_SYNC_POINT(call)                                       \
  do {                                                                      \
    if (::dptrain::cuda::detail::sync_each_op()) [[unlikely]]               \
      ::dptrain::cuda::detail::synchronize_after(call, __FILE__, __LINE__); \
  } while (0)

#define DPTRAIN_CUDA_CHECK(call)                                                      \
  do {                                                                                \
    const cudaError_t dptrain_status_ = (call);                                       \
    if (dptrain_status_ != cudaSuccess) [[unlikely]]                                  \
      ::dptrain::cuda::detail::fail_cuda(dptrain_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DPTRAIN_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                              \
    const cublasStatus_t dptrain_status_ = (call);                                                  \
    if (dptrain_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                      \
      ::dptrain::cuda::detail::fail_call(                                                           \
          #call, ::dptrain::cuda::detail::cublas_status_name(dptrain_status_), __FILE__, __LINE__); \
    DPTRAIN_CUDA_SYNC_POINT(#call);                                                                 \
  } while (0)

#define DPTRAIN_CUDNN_CHECK(call)                                                                          \
  do {                                                                                                     \
    const cudnnStatus_t dptrain_status_ = (call);                                                          \
    if (dptrain_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                              \
      ::dptrain::cuda::detail::fail_call(#call, cudnnGetErrorString(dptrain_status_), __FILE__, __LINE__); \
    DPTRAIN_CUDA_SYNC_POINT(#call);                                                                        \
  } while (0)

#define DPTRAIN_NCCL_CHECK(call)                                                                          \
  do {                                                                                                    \
    const ncclResult_t dptrain_status_ = (call);                                                          \
    if (dptrain_status_ != ncclSuccess) [[unlikely]]                                                      \
      ::dptrain::cuda::detail::fail_call(#call, ncclGetErrorString(dptrain_status_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call; with
// DPTRAIN_CUDA_SYNC=1 the kernel's own faults too.
#define DPTRAIN_CUDA_CHECK_LAUNCH(kernel)                                                           \
  do {                                                                                              \
    const cudaError_t dptrain_status_ = cudaGetLastError();                                         \
    if (dptrain_status_ != cudaSuccess) [[unlikely]]                                                \
      ::dptrain::cuda::detail::fail_cuda(dptrain_status_, "launch of " kernel, __FILE__, __LINE__); \
    DPTRAIN_CUDA_SYNC_POINT(kernel);                                                                \
  } while (0)
