// Strict JSON object reading for configs.
#include "core/config_reader.h"

namespace dptrain {

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

void ObjectReader::finish() const {
  for (auto& [key, value] : object_.items()) {
    if (!used_.count(key)) {
      DPTRAIN_FAIL("config key ", path_of(key), " is not a known key",
                   "; check its spelling against the README's config reference");
    }
  }
}

}  // namespace dptrain
