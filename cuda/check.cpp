// The error paths of the CUDA, cuBLAS, cuDNN and NCCL checks.
#include "cuda/check.h"

#include <cstdlib>
#include <cstring>

namespace dptrain::cuda::detail {

void fail_call(const char* call, const std::string& error, const char* file, int line) {
  ::dptrain::detail::throw_error(file, line, std::string(call) + " failed: " + error);
}

void fail_cuda(cudaError_t status, const char* call, const char* file, int line) {
  // A non-sticky error stays the runtime's "last error" until read: read it now, or the launch
  // check after the next kernel reports this call's failure as that kernel's.
  cudaGetLastError();
  fail_call(call, std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status), file, line);
}

bool sync_each_op() {
  static const bool on = [] {
    const char* v = std::getenv("DPTRAIN_CUDA_SYNC");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void synchronize_after(const char* call, const char* file, int line) {
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess)
    fail_cuda(status,
              (std::string(call) + " (found by DPTRAIN_CUDA_SYNC=1, which synchronizes after it)").c_str(),
              file, line);
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED (no usable GPU or driver?)";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED (out of device memory)";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "an unknown cuBLAS status";
  }
}

}  // namespace dptrain::cuda::detail
