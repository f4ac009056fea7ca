// Trying ranked alternatives in turn (cuDNN's algorithms for one convolution): the first that works
// is kept for the next call, and one that fails is passed over for the next in rank, as PyTorch's
// try_all does. Plain C++, so that its logic is tested without a GPU.
#pragma once

#include <cstddef>
#include <string>

#include "core/error.h"

namespace dptrain::cuda {

// Tries `attempt(i)` for i = start, start + 1, ... < count until one returns an empty string (it
// worked), and returns that i. Each failure's text is collected; when all fail, throws naming `what`,
// each candidate's failure and a hint. Candidates before `start` failed on an earlier call.
template <typename Attempt>
std::size_t first_working(std::size_t count, std::size_t start, const std::string& what,
                          const std::string& hint, Attempt attempt) {
  std::string failures;
  for (std::size_t i = start; i < count; ++i) {
    const std::string error = attempt(i);
    if (error.empty()) return i;
    failures += (failures.empty() ? "" : "; ") + error;
  }
  DPTRAIN_FAIL(what, ": no candidate worked (", count - start, " tried",
               failures.empty() ? std::string() : ": " + failures, "); ", hint);
}

}  // namespace dptrain::cuda
