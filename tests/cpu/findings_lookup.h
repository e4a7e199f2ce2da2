// Test helpers over a run's findings: the first one a rule gave, and all of
// them as text for a failure message.
#pragma once

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

inline std::string dump(const std::vector<Finding>& findings) {
  std::string s;
  for (const auto& f : findings) s += "\n  - [" + f.rule + "] " + f.text;
  return s.empty() ? " (none)" : s;
}

}  // namespace attnprof::testing
