// Plain-text pieces of the reports (compare's table, analyze's and diff's
// text): times with their unit, signed and optional figures, and a table
// whose columns are padded to their widest cell. Internal to report/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "analysis/format.h"

namespace attnprof::report_text {

using analysis::format;

inline std::string time_str(double us) {
  if (us >= 1e6) return format("%.2f s", us / 1e6);
  if (us >= 1e3) return format("%.3f ms", us / 1e3);
  return format("%.1f us", us);
}

// Built by appending: GCC 12 warns (-Wrestrict, a false positive) on "+" + string.
inline std::string with_sign(double x, const std::string& magnitude) {
  std::string s = x > 0 ? "+" : x < 0 ? "-" : "";
  s += magnitude;
  return s;
}

inline std::string signed_time(double us) { return with_sign(us, time_str(std::abs(us))); }

inline std::string count_str(double x) { return x == std::floor(x) ? format("%.0f", x) : format("%.1f", x); }

inline std::string opt(const char* f, const std::optional<double>& v) { return v ? format(f, *v) : "-"; }

inline std::string shorten(const std::string& s, std::size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

// Columns padded to their widest cell; `tail` (a free-text last column) may
// carry continuation lines, indented under it.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::string tail = {})
      : header_(std::move(header)), tail_(std::move(tail)) {}
  void add(std::vector<std::string> cells, std::vector<std::string> tail = {}) {
    rows_.push_back({std::move(cells), std::move(tail)});
  }
  std::string str(const std::string& indent = "") const {
    std::vector<std::size_t> w(header_.size());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = header_[i].size();
    for (const auto& r : rows_) {
      for (std::size_t i = 0; i < r.cells.size() && i < w.size(); ++i) w[i] = std::max(w[i], r.cells[i].size());
    }
    std::ostringstream os;
    std::size_t total = 0;
    for (auto x : w) total += x + 2;
    const auto line = [&](const std::vector<std::string>& cells, const std::string& tail) {
      std::string l = indent;
      for (std::size_t i = 0; i < cells.size(); ++i) {
        l += cells[i];
        if (i + 1 < cells.size() || !tail.empty()) l += std::string(w[i] - cells[i].size() + 2, ' ');
      }
      l += tail;
      while (!l.empty() && l.back() == ' ') l.pop_back();
      os << l << "\n";
    };
    line(header_, tail_);
    os << indent << std::string(total + (tail_.empty() ? 0 : tail_.size()) - 2, '-') << "\n";
    for (const auto& r : rows_) {
      line(r.cells, r.tail.empty() ? "" : r.tail.front());
      for (std::size_t k = 1; k < r.tail.size(); ++k) os << indent << std::string(total, ' ') << r.tail[k] << "\n";
    }
    return os.str();
  }

 private:
  struct Row {
    std::vector<std::string> cells, tail;
  };
  std::vector<std::string> header_;
  std::string tail_;
  std::vector<Row> rows_;
};

}  // namespace attnprof::report_text
