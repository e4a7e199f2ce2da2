// Chrome/Kineto trace input: the JSON torch.profiler writes
// (export_chrome_trace, the TensorBoard handler's .pt.trace.json, gzipped or
// not) and the JSON attnprof writes (attnprof/trace_io.h), read back into the
// typed Trace every rule reads. The file is streamed: it is decompressed and
// split into events a chunk at a time, each event parsed on its own, so
// memory grows with the events kept, not with the file.
//
// Files handed to us are untrusted. Anything that is not a readable trace
// (not JSON, truncated, too deep, not UTF-8, wrong types, missing fields, a
// gzip stream that inflates past the limit) is refused with one
// Error(ErrorKind::BadInput) whose message is "cannot read PATH: why".
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "attnprof/activity.h"

namespace attnprof {

struct TraceReadOptions {
  // Bytes of JSON read (after decompression) before the file is refused: a
  // gzip bomb, or a trace too big to analyse on this machine.
  std::uint64_t max_bytes = std::uint64_t{4} << 30;
  std::uint64_t max_events = 20'000'000;
  std::size_t max_event_bytes = std::size_t{16} << 20;  // one event's JSON text
  int max_depth = 64;                                   // nesting of arrays and objects
};

// Reads `path` ("-" for standard input), gzipped or not. Events keep their
// trace order; times are nanoseconds from the trace's clock (base plus ts);
// each kernel's occupancy is computed from its record and the trace's
// deviceProperties (attnprof/occupancy.h). Events the rules do not read
// (python_function, flows, metadata) are skipped.
Trace read_chrome_trace(const std::filesystem::path& path, const TraceReadOptions& options = {});

// The same over JSON text in memory; `source` names it in error messages.
Trace parse_chrome_trace(std::string_view json, std::string_view source = "trace",
                         const TraceReadOptions& options = {});

}  // namespace attnprof
