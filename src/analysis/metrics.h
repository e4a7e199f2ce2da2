// Per-forward figures read off a recorded trace.
#pragma once

#include "analysis/trace_index.h"
#include "attnprof/problem.h"
#include "attnprof/record.h"

namespace attnprof::analysis {

// `ceiling_tflops` and `copy_gbs` are one device's measured matrix-product
// and copy ceilings (DeviceRuntime); 0 where unknown, and then no figure is
// read against them.
Metrics measure(const TraceIndex& index, const Problem& p, double ceiling_tflops, double copy_gbs = 0);
// The same, indexing the trace first.
Metrics measure(const Trace& t, const Problem& p, double ceiling_tflops, double copy_gbs = 0);

}  // namespace attnprof::analysis
