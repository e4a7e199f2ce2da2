// How the Chrome trace reader (trace_reader.cpp) refuses a trace: an
// Unreadable with the reason, which its entry points turn into "cannot read
// PATH: why", and the phrases the reasons share. Internal to the analysis
// layer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "analysis/format.h"

namespace attnprof::trace_reading {

// Why the trace cannot be read; turned into "cannot read PATH: why" at the top.
struct Unreadable {
  std::string why;
};

[[noreturn]] inline void refuse(std::string why) { throw Unreadable{std::move(why)}; }

inline std::string byte_at(std::uint64_t offset) { return "at byte " + std::to_string(offset); }

inline std::string size_str(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= (1 << 30)) return analysis::format("%.1f GiB", b / (1 << 30));
  if (b >= (1 << 20)) return analysis::format("%.1f MiB", b / (1 << 20));
  return analysis::format("%.0f bytes", b);
}

}  // namespace attnprof::trace_reading
