// What problem.cpp (geometry, sizes, names), problem_describe.cpp (file stem,
// description) and problem_validate.cpp (the checks and their one-line errors)
// share: the real as descriptions and messages write it, and a packed batch's
// longest length and row count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace attnprof::problem_detail {

// A real as %g writes it ("30", "2.5", "nan"): for the description, file stems and errors.
inline std::string format_real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline std::int64_t max_of(const std::vector<std::int64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

inline std::int64_t sum_of(const std::vector<std::int64_t>& v) {
  std::int64_t n = 0;
  for (const std::int64_t x : v) n += x;
  return n;
}

}  // namespace attnprof::problem_detail
