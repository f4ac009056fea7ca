// The config reference page and the fuzz dictionary, rendered from a table's description.
#include "core/config_table.h"

#include <set>

namespace dptrain::config_table {
namespace {

// A table cell: one line, with the pipes that would end it escaped.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

std::string code(const std::string& text) {
  return text.empty() ? "" : "`" + text + "`";
}

std::string applies_cell(const FieldDoc& f) {
  if (f.applies.empty()) return "";
  return code(f.applies) + (f.ignored_outside ? " (ignored otherwise)" : "");
}

std::string section_markdown(const SectionDoc& s) {
  std::string out = "\n## " + (s.path.empty() ? std::string("Top level") : code(s.path)) + "\n\n" + s.doc;
  if (!s.applies.empty()) out += " Applies when " + code(s.applies) + "; given otherwise, it is an error.";
  out += "\n\n| Key | Type | Default | Allowed | Applies when | Description |\n";
  out += "|---|---|---|---|---|---|\n";
  for (const FieldDoc& f : s.fields)
    out += "| " + code(f.path) + " | " + cell(f.type) + " | " + cell(f.fallback) + " | " + cell(f.allowed) +
           " | " + cell(applies_cell(f)) + " | " + cell(f.doc) + " |\n";
  return out;
}

// A libFuzzer dictionary entry: a C-style quoted string.
std::string entry(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"\n";
}

}  // namespace

std::string render_reference(const std::vector<SectionDoc>& sections, const std::string& preamble) {
  std::string out = preamble;
  for (const SectionDoc& s : sections) out += section_markdown(s);
  return out;
}

std::string render_fuzz_dictionary(const std::vector<SectionDoc>& sections) {
  std::set<std::string> seen;
  std::string keys, names, paths;
  auto add = [&](std::string& to, const std::string& text) {
    if (seen.insert(text).second) to += entry(text);
  };
  for (const SectionDoc& s : sections) {
    if (!s.path.empty()) add(keys, "\"" + s.path.substr(s.path.rfind('.') + 1) + "\"");
    for (const FieldDoc& f : s.fields) {
      add(keys, "\"" + f.path.substr(f.path.rfind('.') + 1) + "\"");
      for (const std::string& n : f.names) add(names, "\"" + n + "\"");
      add(paths, f.path + "=");
    }
  }
  return keys + names + paths;
}

}  // namespace dptrain::config_table
