// A CLI11 check for the benchmarks' counts and times, whose error reads "--steps: must be at least 1, not 0".
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>

namespace dptrain::bench {

// Accepts a number >= least (> least where `strictly`); CLI11 prefixes the option's name to the error.
inline CLI::Validator at_least(double least, bool strictly = false) {
  char bound[32];
  std::snprintf(bound, sizeof bound, "%g", least);
  const std::string rule = std::string(strictly ? "above " : "at least ") + bound;
  return CLI::Validator(
      [least, strictly, rule](std::string& text) -> std::string {
        std::size_t used = 0;
        double value = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != text.size() || text.empty() || !std::isfinite(value))
          return "must be a number " + rule + ", not '" + text + "'";
        if (value < least || (strictly && value == least)) return "must be " + rule + ", not " + text;
        return {};
      },
      (strictly ? ">" : ">=") + std::string(bound));
}

}  // namespace dptrain::bench
