// Number formatting shared by the findings and the report's tables.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

namespace attnprof::analysis {

// Whether `f` holds exactly one conversion that reads a double (%f, %e, %g,
// %a and their capitals, with flags, a width and a precision written out, no
// '*') besides any "%%": what format() may be given.
constexpr bool is_double_format(const char* f) {
  int conversions = 0;
  for (const char* p = f; *p; ++p) {
    if (*p != '%') continue;
    if (*++p == '%') continue;
    while (*p == '-' || *p == '+' || *p == ' ' || *p == '#' || *p == '0') ++p;
    while (*p >= '0' && *p <= '9') ++p;
    if (*p == '.') {
      ++p;
      while (*p >= '0' && *p <= '9') ++p;
    }
    if (*p == 'L' || *p == 'l') ++p;  // %lf is a double too; %Lf is checked out below
    const char c = *p;
    if (c == 0 || p[-1] == 'L' ||
        !(c == 'f' || c == 'F' || c == 'e' || c == 'E' || c == 'g' || c == 'G' || c == 'a' || c == 'A')) {
      return false;
    }
    ++conversions;
  }
  return conversions == 1;
}

// printf-style formatting of one number. A format that would read the double
// as anything else (a %x, undefined behaviour) is refused, not printed.
inline std::string format(const char* f, double v) {
  if (!is_double_format(f)) throw std::logic_error(std::string("analysis::format: not a format of one double: ") + f);
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
