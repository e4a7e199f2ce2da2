// Number formatting shared by the report's tables and findings.
#pragma once

#include <cstdio>
#include <string>

namespace attnprof::report {

// printf-style formatting of one number.
inline std::string format(const char* f, double v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline std::string mib(double bytes) { return format("%.1f MiB", bytes / (1024.0 * 1024.0)); }

}  // namespace attnprof::report
