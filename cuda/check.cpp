// The error path of the CUDA/NCCL checks.
#include "cuda/check.h"

namespace dptrain::cuda::detail {

void fail_call(const char* call, const std::string& error, const char* file, int line) {
  ::dptrain::detail::throw_error(file, line, std::string(call) + " failed: " + error);
}

}  // namespace dptrain::cuda::detail
