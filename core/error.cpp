// Builds the located error message thrown by DPTRAIN_CHECK / DPTRAIN_FAIL; errno as text.
#include "core/error.h"

#include <cstring>

namespace dptrain {

std::string errno_text(int error) {
  const char* name = strerrorname_np(error);
  return std::string(std::strerror(error)) + (name ? " (" + std::string(name) + ")" : "");
}

}  // namespace dptrain

namespace dptrain::detail {

void throw_error(const char* file, int line, const std::string& message) {
  // Keep the path short: "core/ops.cpp" reads better than an absolute build path.
  const char* shown = file;
  for (const char* dir :
       {"/core/", "/layers/", "/optim/", "/data/", "/distributed/", "/trainer/", "/tests/"}) {
    if (const char* found = std::strstr(file, dir)) {
      shown = found + 1;
      break;
    }
  }
  throw Error(message + " (" + shown + ":" + std::to_string(line) + ")");
}

}  // namespace dptrain::detail
