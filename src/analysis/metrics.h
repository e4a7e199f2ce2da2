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

// The runner still names these report::; they are the analysis layer's now.
// Remove once src/dispatch/runner.cpp says analysis::.
namespace attnprof::report {
using analysis::kForwardRange;
using analysis::measure;
}  // namespace attnprof::report
