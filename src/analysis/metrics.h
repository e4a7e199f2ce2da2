// Per-forward figures read off a recorded trace.
#pragma once

#include "analysis/trace_index.h"
#include "attnprof/problem.h"
#include "attnprof/runner.h"

namespace attnprof::analysis {

Metrics measure(const TraceIndex& index, const Problem& p, double ceiling_tflops);
// The same, indexing the trace first.
Metrics measure(const Trace& t, const Problem& p, double ceiling_tflops);

}  // namespace attnprof::analysis
