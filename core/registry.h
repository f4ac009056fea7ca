// Lookup by name in the project's registries (layers, architectures, optimizers, datasets, gradient
// syncs, wire encodings): each is a plain array of entries with a `name`, one line per entry, and an
// unknown name is an error that lists the registered ones.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace dptrain {

// "a", "b" or "c"
inline std::string quoted_alternatives(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + ("\"" + names[i] + "\"");
  return text;
}

template <typename Entry>
std::vector<std::string> registered_names(std::span<const Entry* const> entries) {
  std::vector<std::string> names;
  for (const Entry* e : entries) names.push_back(e->name);
  return names;
}

// `what` names the registry in the error: "config key distributed.gradient_sync".
template <typename Entry>
const Entry& find_registered(std::span<const Entry* const> entries, const std::string& name,
                             const std::string& what) {
  for (const Entry* e : entries)
    if (name == e->name) return *e;
  DPTRAIN_FAIL(what, " = \"", name, "\" is not registered; use ",
               quoted_alternatives(registered_names(entries)));
}

}  // namespace dptrain
