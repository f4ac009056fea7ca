// Strict JSON object reading for configs.
#include "core/config_reader.h"

#include <algorithm>
#include <numeric>

namespace dptrain {
namespace {

// Levenshtein's distance: the fewest insertions, deletions and substitutions from a to b.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The candidate nearest to `key` in spelling, if within a third of its length (at least one edit),
// else "".
template <typename Keys>
std::string nearest(const std::string& key, const Keys& candidates) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(1, key.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t d = edit_distance(key, candidate);
    if (d < best_distance) best = candidate, best_distance = d;
  }
  return best;
}

}  // namespace

std::string json_type_name(const Json& value) {
  if (value.is_boolean()) return "a boolean";
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "a list";
  if (value.is_object()) return "an object";
  return "null";
}

ObjectReader::ObjectReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {
  DPTRAIN_CHECK(object_.is_object(), "config key ", path_.empty() ? "<root>" : path_,
                ": expected an object, got ", json_type_name(object_), " ", object_.dump());
}

const Json& ObjectReader::raw(const std::string& key) {
  used_.insert(key);
  return object_.at(key);
}

std::string ObjectReader::get_choice(const std::string& key, const std::string& fallback,
                                     const std::vector<std::string>& choices) {
  const std::string value = get<std::string>(key, fallback);
  for (const std::string& c : choices)
    if (c == value) return value;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "\"" : ", \"") + c + "\"";
  DPTRAIN_FAIL("config key ", path_of(key), " = \"", value, "\" is not one of ", list);
}

std::string ObjectReader::missing(const std::string& key, const std::string& context) const {
  std::vector<std::string> unread;
  for (auto& [name, value] : object_.items())
    if (!used_.count(name)) unread.push_back(name);
  const std::string near = nearest(key, unread);
  return "config key " + path_of(key) + " is missing" + context +
         (near.empty() ? "" : "; " + path_of(near) + " is given: a misspelling?");
}

void ObjectReader::finish() const {
  for (auto& [key, value] : object_.items()) {
    if (!used_.count(key)) {
      const std::string near = nearest(key, asked_);
      DPTRAIN_FAIL("config key ", path_of(key), " is not a known key",
                   near.empty() ? "; check its spelling against docs/config.md"
                                : "; did you mean " + path_of(near) + "? (docs/config.md lists every key)");
    }
  }
}

}  // namespace dptrain
