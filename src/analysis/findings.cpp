#include "analysis/findings.h"

#include <algorithm>

#include "analysis/normalize.h"
#include "analysis/rules.h"

namespace attnprof::analysis {
namespace {

// The 16-bit dtype most of a trace's ops take, if any take one.
std::optional<DType> trace_dtype(const TraceIndex& ix) {
  std::size_t bf16 = 0, fp16 = 0;
  for (EventIndex i = 0; i < static_cast<EventIndex>(ix.trace().activities.size()); ++i) {
    if (ix.at(i).type != ActivityType::CpuOp) continue;
    const auto d = first_dtype(ix.dtypes(i));
    bf16 += d == "bf16";
    fp16 += d == "fp16";
  }
  if (bf16 == 0 && fp16 == 0) return std::nullopt;
  return bf16 >= fp16 ? DType::BF16 : DType::F16;
}

}  // namespace

std::vector<Finding> findings(const TraceIndex& index, const RunResult& r, const std::vector<RunResult>& all,
                              const Guesses& guesses, const std::vector<AttentionCall>* attention, const Graph* graph) {
  std::vector<Finding> out;
  if (r.failure || r.metrics.steps == 0) return out;
  // The rules count events in `index`: where a long schedule's trace kept its
  // last steps only (Trace::steps_folded), per call is over the trace's calls,
  // not every call the figures cover.
  const int steps = r.trace.steps_folded > 0 ? static_cast<int>(index.forwards().size()) : r.metrics.steps;
  const RuleInput in{.index = index,
                     .run = r,
                     .all = all,
                     .guesses = guesses,
                     .steps = std::max(1, steps),
                     .gpu = r.problem.device == Device::Cuda,
                     .dtype = r.source.empty() ? std::optional<DType>(r.problem.dtype) : trace_dtype(index),
                     .attention = attention,
                     .graph = graph};
  for (const Rule& rule : rule_table()) {
    for (Finding& f : rule.fn(in)) {
      f.rule = std::string(rule.id);
      f.severity = std::max(f.severity, rule.severity);
      out.push_back(std::move(f));
    }
  }
  return out;
}

std::vector<Finding> findings(const RunResult& r, const std::vector<RunResult>& all, const Guesses& guesses) {
  if (r.failure || r.metrics.steps == 0) return {};
  return findings(TraceIndex(r.trace), r, all, guesses);
}

void apply_acceptance(std::vector<RunResult>& results) {
  std::optional<double> math_rel;
  for (const auto& r : results) {
    if (r.traits.reference_precision && r.error && r.error->nan_rows == 0) math_rel = r.error->rel;
  }
  for (auto& r : results) {
    if (!r.error) continue;
    r.acceptance = accept(r.problem.dtype, *r.error, math_rel, r.traits.nan_on_fully_masked);
  }
}

}  // namespace attnprof::analysis
