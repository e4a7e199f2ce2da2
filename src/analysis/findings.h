// "What the trace shows": the rule table run over one run's trace, one record
// (attnprof/findings.h) per rule that fires, in the table's order.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/analyze.h"
#include "attnprof/findings.h"
#include "attnprof/record.h"

namespace attnprof::analysis {

struct Graph;

// Runs every rule on `r`. `all` holds the other backends of the same
// comparison (for cross-backend rules such as memory against the baseline);
// may be empty. `index` must index r.trace.
// `attention`: the trace's attention calls (attention_calls.h), for a trace
// read from elsewhere; null for a run, whose every op is the attention's.
// `graph`: a CUDA graph replay's graph (graph_replays.h), whose device work
// no op encloses: the rules name the op that captured it instead.
std::vector<Finding> findings(const TraceIndex& index, const RunResult& r, const std::vector<RunResult>& all,
                              const Guesses& guesses, const std::vector<AttentionCall>* attention = nullptr,
                              const Graph* graph = nullptr);
// The same, indexing r.trace first.
std::vector<Finding> findings(const RunResult& r, const std::vector<RunResult>& all, const Guesses& guesses);

// Applies the DESIGN.md acceptance rule with the reference-precision
// backend's error when it ran.
void apply_acceptance(std::vector<RunResult>& results);

}  // namespace attnprof::analysis
