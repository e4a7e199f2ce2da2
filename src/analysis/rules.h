// The rule table: each rule one function that reads a run through its trace
// index and returns the findings it makes (text, evidence, figures); the
// table stamps its id and severity on them.
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "analysis/findings.h"

namespace attnprof::analysis {

// What a rule reads: the run, the comparison it is part of, the user's
// guesses, and the run's trace index.
struct RuleInput {
  const TraceIndex& index;
  const RunResult& run;
  const std::vector<RunResult>& all;
  const Guesses& guesses;
  int steps;  // calls recorded (at least 1): forwards, profiler steps, or the whole trace
  bool gpu;
  // The inputs' dtype: the problem's for a run; for a trace read from a file,
  // the 16-bit dtype its ops take, if any.
  std::optional<DType> dtype;
  // A trace from elsewhere: its attention calls (outside them, upcasts and
  // copies are the model's, not attention's). Null for a run.
  const std::vector<AttentionCall>* attention = nullptr;
  // A CUDA graph replay's graph (graph_replays.h), or null: its device work
  // goes under the op that captured it (replay_op), as no op encloses it.
  const Graph* graph = nullptr;
};

using RuleFn = std::vector<Finding> (*)(const RuleInput&);

struct Rule {
  std::string_view id;
  // The least severity of the rule's findings: a rule may raise it on a
  // finding that flags something (split-kv's over-split combine, say).
  Severity severity;
  RuleFn fn;
};

// Every rule, in the order its findings are printed.
std::span<const Rule> rule_table();

}  // namespace attnprof::analysis
