// ObjectReader: strict access to a JSON object for configs: typed getters whose errors name the
// full key path, range checks, and a finish() that rejects keys nobody asked for.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace dptrain {

using Json = nlohmann::json;

class ObjectReader {
 public:
  ObjectReader(const Json& object, std::string path);

  bool has(const std::string& key) const {
    asked_.insert(key);
    return object_.contains(key);
  }
  std::string path_of(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  // The raw value of a present key (marks it used).
  const Json& raw(const std::string& key);

  template <typename T>
  T get(const std::string& key, T fallback) {
    return has(key) ? require<T>(key) : fallback;
  }

  template <typename T>
  T require(const std::string& key) {
    DPTRAIN_CHECK(has(key), missing(key, hint()));
    return convert<T>(raw(key), path_of(key));
  }

  // "config key <path> is missing<context>", and the object's unread key nearest to it in spelling
  // where one is near: {"out_feature": 128} is a dense layer's out_features misspelt.
  std::string missing(const std::string& key, const std::string& context) const;

  // Numeric key with an inclusive range.
  template <typename T>
  T get_in_range(const std::string& key, T fallback, T low, T high) {
    const T value = get<T>(key, fallback);
    DPTRAIN_CHECK(value >= low && value <= high, "config key ", path_of(key), " = ", value,
                  " is out of range [", low, ", ", high, "]");
    return value;
  }

  // A string that must be one of `choices`.
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& choices);

  // Throws for the first key that was never read: a typo must not be silently ignored.
  void finish() const;

  template <typename T>
  static T convert(const Json& value, const std::string& path);

  // " (in data)": where a missing key was looked for.
  std::string hint() const { return path_.empty() ? "" : " (in " + path_ + ")"; }

 private:
  const Json& object_;
  std::string path_;
  std::set<std::string> used_;
  mutable std::set<std::string> asked_;  // every key looked for, present or not: the known keys
};

std::string json_type_name(const Json& value);

template <typename T>
T ObjectReader::convert(const Json& value, const std::string& path) {
  auto wrong = [&](const char* expected) {
    DPTRAIN_FAIL("config key ", path, ": expected ", expected, ", got ", json_type_name(value), " ",
                 value.dump());
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) wrong("true or false");
    return value.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!value.is_number_integer()) wrong("an integer");
    // nlohmann's get<T>() wraps out-of-range values; a negative seed must not become 2^64 - 1.
    const bool fits = value.is_number_unsigned() ? std::in_range<T>(value.get<uint64_t>())
                                                 : std::in_range<T>(value.get<int64_t>());
    if (!fits) wrong("an integer in range for this key");
    return value.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number()) wrong("a number");
    return value.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) wrong("a string");
    return value.get<std::string>();
  } else {
    // std::vector of one of the above.
    if (!value.is_array()) wrong("a list");
    T out;
    for (std::size_t i = 0; i < value.size(); ++i)
      out.push_back(convert<typename T::value_type>(value[i], path + "[" + std::to_string(i) + "]"));
    return out;
  }
}

}  // namespace dptrain
