// Chrome trace output: the Trace records written in the schema PyTorch's
// profiler writes, so Perfetto, chrome://tracing and trace-analysis libraries
// read them. Writers see only the records (Kineto's layering).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "attnprof/activity.h"

namespace attnprof {

// The whole trace as one JSON document's text. Times are microseconds relative to
// baseTimeNanoseconds (Trace::base_ns, or the earliest event when that is
// unset or later), so doubles keep nanosecond precision.
std::string chrome_trace_json(const Trace& trace);

// Writes chrome_trace_json(trace) to `path`, creating its directory. The file
// appears complete or not at all (a temporary in the same directory, renamed
// at the end). Throws Error(Io) naming the path and the reason.
void write_chrome_trace(const Trace& trace, const std::filesystem::path& path);

// The same all-or-nothing write for any text output (tables, summaries);
// `what` names it in the error message ("trace", "table", ...).
void write_file_atomically(const std::filesystem::path& path, std::string_view contents, std::string_view what);

// Checks, before any work, that outputs can be written: a directory that can
// be created and written into, or a file path whose directory can. Leaves
// nothing behind but the directories it created. Throws Error(Io) naming
// `flag` ("--trace-dir", "--json") and the reason.
void check_output_dir(const std::filesystem::path& dir, std::string_view flag);
void check_output_file(const std::filesystem::path& path, std::string_view flag);

}  // namespace attnprof
