// Error type and checking macros: every failure carries what failed, where, and a hint.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dptrain {

// Thrown for every user-facing failure; main() prints what() as one line and stops all ranks.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "No space left on device (ENOSPC)": errno as the manual says it, and the name to search for.
std::string errno_text(int error);

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace dptrain

// DPTRAIN_CHECK(cond, parts...): throws dptrain::Error "<parts> (file:line)" when cond is false.
#define DPTRAIN_CHECK(cond, ...)                                                                  \
  do {                                                                                            \
    if (!(cond)) [[unlikely]]                                                                     \
      ::dptrain::detail::throw_error(__FILE__, __LINE__, ::dptrain::detail::concat(__VA_ARGS__)); \
  } while (0)

#define DPTRAIN_FAIL(...) \
  ::dptrain::detail::throw_error(__FILE__, __LINE__, ::dptrain::detail::concat(__VA_ARGS__))
