// Number formatting shared by the findings and the report's tables.
#pragma once

#include <cstdio>
#include <string>

namespace attnprof::analysis {

// printf-style formatting of one number.
inline std::string format(const char* f, double v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline std::string mib(double bytes) { return format("%.1f MiB", bytes / (1024.0 * 1024.0)); }

}  // namespace attnprof::analysis
