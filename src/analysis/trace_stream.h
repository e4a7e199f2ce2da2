// The trace reader's seam between where the text comes from (trace_input.cpp:
// a file, gzip, memory) and how its events are read (trace_reader.cpp).
#pragma once

#include <cstddef>
#include <functional>

#include "attnprof/activity.h"
#include "attnprof/trace_reader.h"

namespace attnprof {

// Fills up to `cap` bytes of the document's text; 0 at its end.
using ReadChunk = std::function<std::size_t(char* buf, std::size_t cap)>;

// Reads the whole document a chunk at a time into a Trace. Throws
// trace_reading::Unreadable (trace_unreadable.h) with the reason when it is not a
// readable trace; the caller names the source.
Trace read_trace_stream(const ReadChunk& read, const TraceReadOptions& o);

}  // namespace attnprof
