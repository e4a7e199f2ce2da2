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

// Bytes in the largest unit that keeps them above 1: "512 B", "3.0 KiB", "1.53 GiB".
inline std::string bytes_str(double b) {
  if (b >= 1024.0 * 1024 * 1024) return format("%.2f GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return format("%.1f MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return format("%.1f KiB", b / 1024.0);
  return format("%.0f B", b);
}

}  // namespace attnprof::analysis
