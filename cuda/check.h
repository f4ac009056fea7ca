// Return-code checks for the CUDA runtime, NCCL (and, when they are used, cuBLAS and cuDNN): a
// failed call throws dptrain::Error naming the call, its error string and file:line; main() adds
// the rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "core/error.h"

namespace dptrain::cuda::detail {
[[noreturn]] void fail_call(const char* call, const std::string& error, const char* file, int line);
}

#define DPTRAIN_CUDA_CHECK(call)                                                                       \
  do {                                                                                                 \
    const cudaError_t dptrain_status_ = (call);                                                        \
    if (dptrain_status_ != cudaSuccess) [[unlikely]]                                                   \
      ::dptrain::cuda::detail::fail_call(                                                              \
          #call,                                                                                       \
          std::string(cudaGetErrorName(dptrain_status_)) + ": " + cudaGetErrorString(dptrain_status_), \
          __FILE__, __LINE__);                                                                         \
  } while (0)

#define DPTRAIN_NCCL_CHECK(call)                                                                          \
  do {                                                                                                    \
    const ncclResult_t dptrain_status_ = (call);                                                          \
    if (dptrain_status_ != ncclSuccess) [[unlikely]]                                                      \
      ::dptrain::cuda::detail::fail_call(#call, ncclGetErrorString(dptrain_status_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define DPTRAIN_CUDA_CHECK_LAUNCH() DPTRAIN_CUDA_CHECK(cudaGetLastError())
