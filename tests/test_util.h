// Test helpers shared across tests/: temporary paths and directories, fixture files, test tensors, errors.
//
// Header-only; every test target links dptrain_core. Namespace dptrain::test_util, not
// dptrain::testing: inside namespace dptrain that name would hide GoogleTest's ::testing.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "core/tensor.h"

namespace dptrain::test_util {

// ---- temporary files ----

// <system temp dir>/dptrain_<pid>_<name>: the process id keeps apart test processes that run at once
// (ctest runs each test in a process of its own, two at a time).
inline std::string temp_path(std::string_view name) {
  return (std::filesystem::temp_directory_path() /
          ("dptrain_" + std::to_string(::getpid()) + "_" + std::string(name)))
      .string();
}

// A new, empty directory temp_path("<tag>_<n>"), n counting this process's directories (one left by
// an earlier process of the same id is emptied). The caller removes it.
inline std::filesystem::path make_temp_dir(std::string_view tag) {
  static std::atomic<int> counter{0};
  const std::filesystem::path dir = temp_path(std::string(tag) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// ---- test data ----

// n values uniform in [lo, hi) from Rng(seed), in the generator's order.
inline std::vector<float> uniform_values(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

// start, start + 0.25, start + 0.5, ... in row-major order: exact in float, distinct per element.
inline Tensor iota(const Shape& shape, float start) {
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = start + 0.25f * static_cast<float>(i);
  return t;
}

// Parameters "p0", "p1", ... of the given sizes (1-D), zero, requiring grad.
inline std::vector<NamedTensor> zero_parameters(const std::vector<int64_t>& sizes) {
  std::vector<NamedTensor> p;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    p.push_back({"p" + std::to_string(k), Tensor::zeros({sizes[k]}, true)});
  return p;
}

inline bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  // memcmp's pointers must not be null even for 0 bytes, and an empty vector's may be.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// ---- expected errors ----

// Expects `f` to throw an Error whose message contains every fragment.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> fragments, bool one_line = false) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning '" << *fragments.begin() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    if (one_line) {
      EXPECT_EQ(message.find('\n'), std::string::npos) << "error messages are one line: " << message;
    }
  }
}

// The message of the dptrain::Error that fn throws, or a note that it threw none: for tests that
// check a message's beginning or order (EXPECT_STARTS_WITH), where expect_error checks fragments.
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no dptrain::Error thrown>";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text) << "\nmissing: " << (part)
#define EXPECT_STARTS_WITH(text, part) \
  EXPECT_EQ(std::string(text).rfind(part, 0), 0u) << "in: " << (text) << "\nexpected prefix: " << (part)

// expect_error, and the message is one line: what main prints.
template <typename F>
void expect_one_line_error(F&& f, std::initializer_list<std::string> fragments) {
  expect_error(std::forward<F>(f), fragments, /*one_line=*/true);
}

// ---- tests/fixtures ----
#ifdef DPTRAIN_SOURCE_DIR  // set by tests/CMakeLists.txt's dptrain_test_suite

// One of tests/fixtures/*.safetensors (written by PyTorch, tests/fixtures/make_fixtures.py), read on
// first use: its tensors by name and its metadata by key; a missing one is an Error naming the file.
class FixtureFile {
 public:
  explicit FixtureFile(std::string name) : name_(std::move(name)) {}

  // Loaded once and never freed: its tensors' memory would go back to core's storage cache, a
  // function-local static that exit destroys before a FixtureFile at namespace scope.
  const safetensors::File& file() const {
    if (file_ == nullptr)
      file_ = new safetensors::File(
          safetensors::load(std::string(DPTRAIN_SOURCE_DIR) + "/tests/fixtures/" + name_));
    return *file_;
  }
  const Tensor& get(const std::string& tensor) const {
    const Tensor* t = file().find(tensor);
    if (t == nullptr) throw Error("fixture tensor '" + tensor + "' is missing from " + name_);
    return *t;
  }
  const std::string& meta(const std::string& key) const {
    const auto it = file().metadata.find(key);
    if (it == file().metadata.end()) throw Error("fixture metadata '" + key + "' is missing from " + name_);
    return it->second;
  }
  int meta_int(const std::string& key) const { return std::stoi(meta(key)); }
  float meta_float(const std::string& key) const { return std::stof(meta(key)); }
  bool meta_bool(const std::string& key) const {  // Python's True / False
    const std::string& v = meta(key);
    if (v != "True" && v != "False")
      throw Error("fixture metadata '" + key + "' = '" + v + "' is not a Python bool");
    return v == "True";
  }

 private:
  std::string name_;
  mutable const safetensors::File* file_ = nullptr;
};

#endif  // DPTRAIN_SOURCE_DIR

}  // namespace dptrain::test_util
