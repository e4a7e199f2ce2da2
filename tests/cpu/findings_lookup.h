// Test helpers over a run's findings: the first one a rule gave, the only one
// (an exception when it gave none or several), and all of them as text for a
// failure message.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/findings.h"

namespace attnprof::testing {

inline const Finding* by_rule(const std::vector<Finding>& fs, std::string_view rule) {
  for (const auto& f : fs) {
    if (f.rule == rule) return &f;
  }
  return nullptr;
}

// The one finding a rule made (fails the test when it made none or several).
inline const Finding& only(const std::vector<Finding>& findings, std::string_view rule) {
  const Finding* hit = nullptr;
  int n = 0;
  for (const auto& f : findings) {
    if (f.rule == rule) {
      hit = &f;
      ++n;
    }
  }
  if (n != 1) throw std::runtime_error(std::string(rule) + ": " + std::to_string(n) + " findings");
  return *hit;
}

inline std::string dump(const std::vector<Finding>& findings) {
  std::string s;
  for (const auto& f : findings) s += "\n  - [" + f.rule + "] " + f.text;
  return s.empty() ? " (none)" : s;
}

}  // namespace attnprof::testing
