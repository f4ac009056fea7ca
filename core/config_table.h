// Config sections declared once, as tables of fields: the one table parses, fills defaults, writes the
// resolved JSON and describes every key for the reference page and the fuzz dictionary.
#pragma once

#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/config_reader.h"

namespace dptrain::config_table {

// An enum's config spellings, in the order error messages list them.
template <typename E>
using Names = std::initializer_list<std::pair<const char*, E>>;
// A string choice whose names live elsewhere (a registry), so that adding one touches no table.
using Choices = std::vector<std::string> (*)();

template <typename E>
std::string name_of(E value, Names<E> names) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return "?";
}

// Where a field means something; `holds` sees the fields declared before it, already read. With an
// `error` (of the key's path), the key given where the condition fails is that error; without, it is
// read and ignored. Either way the resolved config leaves it out there, so that it parses back.
template <typename Root>
struct When {
  std::string condition;  // the reference page's "applies when"
  std::function<bool(const Root&)> holds;
  std::function<std::string(const std::string& path, const Root&)> error;
};

// The usual error of a When: "config key <path> <text>".
inline auto rule(std::string text) {
  return [text = std::move(text)](const std::string& path, const auto&) {
    return "config key " + path + " " + text;
  };
}

// A default that depends on fields declared before it; `doc` is what the reference page shows.
template <typename F>
struct Computed {
  std::string doc;
  F value;
};
template <typename F>
Computed<F> computed(std::string doc, F value) {
  return {std::move(doc), std::move(value)};
}
// No default: a missing key is an error (where the field applies). `hint` follows "config key K is
// missing"; empty, it names the section.
struct Required {
  std::string hint;
};

// What a field accepts: anything of its type, an inclusive range, an enum's names, a registry's
// names, or a check that returns the error's tail ("" when fine).
struct Any {};
template <typename L, typename H>
struct Range {
  L low;
  H high;
};
template <typename L, typename H>
Range(L, H) -> Range<L, H>;  // clang before 17 deduces no aggregate's arguments
template <typename T>
struct Check {
  std::string doc;
  std::function<std::string(const T&)> problem;
};

// One key as the reference page and the fuzz dictionary see it.
struct FieldDoc {
  std::string path;      // "data.batch_size"
  std::string type;      // "integer", "list of numbers", ...
  std::string fallback;  // Markdown: the default's JSON, or the rule of a computed one
  std::string allowed;   // Markdown: "[1, 1048576]", a choice's names; "" for anything of the type
  std::string applies;   // the condition; "" for always
  bool ignored_outside;  // true: outside the condition the key is accepted and ignored
  std::string doc;
  std::vector<std::string> names;  // a choice's names
};

struct SectionDoc {
  std::string path;  // "" for the top level
  std::string doc;
  std::string applies;
  std::vector<FieldDoc> fields;
};

// The Markdown reference page: `preamble`, then a table per section.
std::string render_reference(const std::vector<SectionDoc>& sections, const std::string& preamble);
// libFuzzer dictionary lines: every key as a JSON string, every choice name, every "path=" of --set.
std::string render_fuzz_dictionary(const std::vector<SectionDoc>& sections);

// A section as the table holds it: its fields and nested sections in declaration order, the types
// erased into read and write functions of the whole config.
template <typename Root>
struct Section {
  struct Field {
    std::string key;
    FieldDoc doc;
    std::optional<When<Root>> when;
    std::function<void(ObjectReader&, Root&)> read;
    std::function<Json(const Root&)> write;
  };
  std::string key, path, doc;
  std::optional<When<Root>> when;
  std::optional<std::string> missing;  // set: the section is required; the error's tail
  std::vector<std::variant<Field, std::unique_ptr<Section>>> entries;
};

namespace detail {

template <typename>
inline constexpr bool kIsComputed = false;
template <typename F>
inline constexpr bool kIsComputed<Computed<F>> = true;
template <typename>
inline constexpr bool kIsRange = false;
template <typename L, typename H>
inline constexpr bool kIsRange<Range<L, H>> = true;
template <typename>
inline constexpr bool kIsVector = false;
template <typename T>
inline constexpr bool kIsVector<std::vector<T>> = true;

template <typename T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "boolean";
  else if constexpr (std::is_integral_v<T>)
    return "integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "number";
  else if constexpr (std::is_same_v<T, std::string>)
    return "string";
  else if constexpr (kIsVector<T>)
    return "list of " + type_name<typename T::value_type>() + "s";
  else
    return "JSON";
}

template <typename T>
std::string shown(const T& value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

// Markdown: `"a"`, `"b"`
inline std::string code_list(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "`\"" : ", `\"") + n + "\"`";
  return list;
}

template <typename E>
std::vector<std::string> names_of(Names<E> names) {
  std::vector<std::string> out;
  for (const auto& [name, v] : names) out.push_back(name);
  return out;
}

template <typename T, typename A>
std::vector<std::string> choice_names(const A& allowed) {
  if constexpr (std::is_same_v<A, Names<T>>)
    return names_of(allowed);
  else if constexpr (std::is_same_v<A, Choices>)
    return allowed();
  else
    return {};
}

template <typename T, typename A>
std::string allowed_doc(const A& allowed) {
  if constexpr (kIsRange<A>) {
    const T low = static_cast<T>(allowed.low), high = static_cast<T>(allowed.high);
    if (std::is_integral_v<T> && high == std::numeric_limits<T>::max()) return ">= " + shown(low);
    return "[" + shown(low) + ", " + shown(high) + "]";
  } else if constexpr (std::is_same_v<A, Check<T>>) {
    return allowed.doc;
  } else {
    return code_list(choice_names<T>(allowed));
  }
}

template <typename T, typename D, typename A>
std::string default_doc(const D& fallback, const A& allowed) {
  if constexpr (std::is_same_v<D, Required>)
    return "required";
  else if constexpr (kIsComputed<D>)
    return fallback.doc;
  else if constexpr (std::is_same_v<A, Names<T>>)
    return "`" + Json(name_of(T(fallback), allowed)).dump() + "`";
  else
    return "`" + Json(T(fallback)).dump() + "`";
}

template <typename T>
T read_plain(ObjectReader& r, const std::string& key, const T& fallback) {
  if constexpr (std::is_same_v<T, Json>)
    return r.has(key) ? r.raw(key) : fallback;
  else
    return r.get<T>(key, fallback);
}

template <typename T, typename A>
T read_allowed(ObjectReader& r, const std::string& key, const T& fallback, const A& allowed) {
  if constexpr (kIsRange<A>) {
    return r.get_in_range<T>(key, fallback, static_cast<T>(allowed.low), static_cast<T>(allowed.high));
  } else if constexpr (std::is_same_v<A, Names<T>>) {
    const std::string chosen = r.get_choice(key, name_of(fallback, allowed), names_of(allowed));
    for (const auto& [name, v] : allowed)
      if (chosen == name) return v;
    return fallback;
  } else if constexpr (std::is_same_v<A, Choices>) {
    return r.get_choice(key, fallback, allowed());
  } else if constexpr (std::is_same_v<A, Check<T>>) {
    T value = read_plain(r, key, fallback);
    const std::string problem = allowed.problem(value);
    DPTRAIN_CHECK(problem.empty(), "config key ", r.path_of(key), problem);
    return value;
  } else {
    return read_plain(r, key, fallback);
  }
}

// The value of `key`, its default where absent; `applies` false: a required key may be absent.
template <typename T, typename Root, typename D, typename A>
T read_field(ObjectReader& r, const std::string& key, const D& fallback, const A& allowed, const Root& root,
             bool applies) {
  if constexpr (std::is_same_v<D, Required>) {
    if (!r.has(key) && !applies) return T{};
    DPTRAIN_CHECK(r.has(key), r.missing(key, fallback.hint.empty() ? r.hint() : " " + fallback.hint));
    return read_allowed<T>(r, key, T{}, allowed);
  } else if constexpr (kIsComputed<D>) {
    return read_allowed<T>(r, key, T(fallback.value(root)), allowed);
  } else {
    return read_allowed<T>(r, key, T(fallback), allowed);
  }
}

template <typename T, typename A>
Json write_value(const T& value, const A& allowed) {
  if constexpr (std::is_same_v<A, Names<T>>)
    return name_of(value, allowed);
  else
    return Json(value);
}

template <typename Root>
void check_applies(const std::optional<When<Root>>& when, const ObjectReader& r, const std::string& key,
                   const Root& root) {
  if (when && when->error && r.has(key) && !when->holds(root))
    DPTRAIN_FAIL(when->error(r.path_of(key), root));
}

}  // namespace detail

// Declares the fields of one section, whose struct S the projection finds inside the whole config.
template <typename Root, typename S>
class SectionBuilder {
 public:
  SectionBuilder(Section<Root>* node, std::function<S&(Root&)> get, std::function<const S&(const Root&)> cget)
      : node_(node), get_(std::move(get)), cget_(std::move(cget)) {}

  // key, member, default (a value, computed(...) or Required{}), allowed values, one-line doc, and
  // where the field applies.
  template <typename T, typename D, typename A>
  void field(const std::string& key, T S::*member, D fallback, A allowed, const std::string& doc,
             std::optional<When<Root>> when = std::nullopt) {
    const std::vector<std::string> names = detail::choice_names<T>(allowed);
    FieldDoc d{path_of(key),
               names.empty() ? detail::type_name<T>() : "string",
               detail::default_doc<T>(fallback, allowed),
               detail::allowed_doc<T>(allowed),
               when ? when->condition : "",
               when && !when->error,
               doc,
               names};
    auto read = [=, get = get_](ObjectReader& r, Root& root) {
      detail::check_applies(when, r, key, root);
      T value = detail::read_field<T>(r, key, fallback, allowed, root, !when || when->holds(root));
      get(root).*member = std::move(value);
    };
    auto write = [=, cget = cget_](const Root& root) {
      return detail::write_value(cget(root).*member, allowed);
    };
    node_->entries.emplace_back(typename Section<Root>::Field{key, std::move(d), when, read, write});
  }

  // A nested object; absent, its fields take their defaults.
  template <typename Sub>
  SectionBuilder<Root, Sub> section(const std::string& key, Sub S::*member, const std::string& doc,
                                    std::optional<When<Root>> when = std::nullopt) {
    auto child = std::make_unique<Section<Root>>();
    child->key = key;
    child->path = path_of(key);
    child->doc = doc;
    child->when = std::move(when);
    Section<Root>* raw = child.get();
    node_->entries.emplace_back(std::move(child));
    return SectionBuilder<Root, Sub>(
        raw, [get = get_, member](Root& root) -> Sub& { return get(root).*member; },
        [cget = cget_, member](const Root& root) -> const Sub& { return cget(root).*member; });
  }

  // The section must be given; `tail` follows "config key <section> is missing".
  void required(std::string tail) { node_->missing = std::move(tail); }

 private:
  std::string path_of(const std::string& key) const {
    return node_->path.empty() ? key : node_->path + "." + key;
  }

  Section<Root>* node_;
  std::function<S&(Root&)> get_;
  std::function<const S&(const Root&)> cget_;
};

template <typename Root>
class Table {
 public:
  explicit Table(std::string doc) : root_(std::make_unique<Section<Root>>()) { root_->doc = std::move(doc); }
  SectionBuilder<Root, Root> root() {
    return SectionBuilder<Root, Root>(
        root_.get(), [](Root& r) -> Root& { return r; }, [](const Root& r) -> const Root& { return r; });
  }
  const Section<Root>& section() const { return *root_; }

 private:
  std::unique_ptr<Section<Root>> root_;
};

template <typename Root>
void read_section(const Section<Root>& section, const Json& json, Root& root);

// A nested section's object, or an empty one (every default) where the key is absent.
template <typename Root>
void read_subsection(ObjectReader& r, const Section<Root>& sub, Root& root) {
  static const Json kAbsent = Json::object();
  if (!r.has(sub.key)) {
    DPTRAIN_CHECK(!sub.missing, "config key ", sub.path, " is missing", sub.missing.value_or(""));
    return read_section(sub, kAbsent, root);
  }
  detail::check_applies(sub.when, r, sub.key, root);
  read_section(sub, r.raw(sub.key), root);
}

// Reads every field in declaration order, so that defaults and conditions see the fields before them.
template <typename Root>
void read_section(const Section<Root>& section, const Json& json, Root& root) {
  ObjectReader r(json, section.path);
  for (const auto& entry : section.entries) {
    if (const auto* field = std::get_if<typename Section<Root>::Field>(&entry))
      field->read(r, root);
    else
      read_subsection(r, *std::get<std::unique_ptr<Section<Root>>>(entry), root);
  }
  r.finish();
}

// The resolved form: every field that applies, defaults included.
template <typename Root>
Json write_section(const Section<Root>& section, const Root& root) {
  Json out = Json::object();
  for (const auto& entry : section.entries) {
    if (const auto* field = std::get_if<typename Section<Root>::Field>(&entry)) {
      if (!field->when || field->when->holds(root)) out[field->key] = field->write(root);
    } else {
      const Section<Root>& sub = *std::get<std::unique_ptr<Section<Root>>>(entry);
      if (!sub.when || sub.when->holds(root)) out[sub.key] = write_section(sub, root);
    }
  }
  return out;
}

// Every section, parents before their nested ones.
template <typename Root>
void describe(const Section<Root>& section, std::vector<SectionDoc>& out) {
  const std::size_t index = out.size();
  out.push_back({section.path, section.doc, section.when ? section.when->condition : "", {}});
  for (const auto& entry : section.entries) {
    if (const auto* field = std::get_if<typename Section<Root>::Field>(&entry))
      out[index].fields.push_back(field->doc);
    else
      describe(*std::get<std::unique_ptr<Section<Root>>>(entry), out);
  }
}

}  // namespace dptrain::config_table
