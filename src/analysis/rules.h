// The rule table: each rule one function that reads a run through its trace
// index and returns the findings it makes (text, evidence, figures); the
// table stamps its id and severity on them.
#pragma once

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
  int steps;  // forwards recorded (at least 1)
  bool gpu;
};

using RuleFn = std::vector<Finding> (*)(const RuleInput&);

struct Rule {
  std::string_view id;
  Severity severity;
  RuleFn fn;
};

// Every rule, in the order its findings are printed.
std::span<const Rule> rule_table();

}  // namespace attnprof::analysis
