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
// each candidate's failure and a hint. Candidates before `start` failed on an earlier call. An
// attempt that throws ends the search (a failure that no other candidate can repair).
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

// Whether a cuDNN status (as an integer, so that this is tested without cuDNN's headers) says the call
// stopped before it wrote any output. cuDNN 9 numbers its statuses by category, the thousands: 2xxx a
// bad parameter and 3xxx not supported are found before any kernel runs; 4xxx (internal error) and
// 5xxx (execution failed) can come after a kernel wrote part of the output. A call that adds into its
// output (beta 1) and fails the second way cannot be retried with another algorithm: that one would
// add to a partial sum.
constexpr bool cudnn_failed_before_writing(int status) {
  return status / 1000 == 2 || status / 1000 == 3;
}

}  // namespace dptrain::cuda
