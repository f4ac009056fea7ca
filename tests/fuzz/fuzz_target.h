// What every fuzz target asserts: an input is either accepted or rejected with dptrain::Error (one
// line naming what is wrong). Any other exception escaping the reader is a bug: the trainer would
// print a message without the file or key, or a library's internals. So is a crash, a leak or
// undefined behaviour, which the sanitizers report.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>

#include "core/error.h"

namespace dptrain::fuzz {

// Runs `read`; returns normally if it accepted or threw dptrain::Error, aborts otherwise.
template <typename F>
void expect_accept_or_error(const char* reader, F&& read) {
  try {
    read();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s threw %s, not dptrain::Error: %s\n", reader, typeid(e).name(), e.what());
    std::abort();
  }
}

}  // namespace dptrain::fuzz
