// A packed (variable-length) batch's work against the padded batch a dense
// call would run: the FLOPs its sequences need, each at its own lengths and
// under its own mask, over those of batch x max_seqlen_q x max_seqlen_k.
#include <string>

#include "analysis/format.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {

using namespace rule_support;

// Silent on a dense problem and on traces read from files (no problem).
std::vector<Finding> packed_batch(const RuleInput& in) {
  const RunResult& r = in.run;
  if (!r.source.empty() || !r.problem.varlen()) return {};
  const Problem& p = r.problem;
  const double packed = p.flops(), padded = p.padded().flops();
  if (padded <= 0) return {};
  const double pct = 100.0 * packed / padded;
  Finding f = found("packed batch: " + std::to_string(p.batch) + " sequences, " +
                    format("%.0f%% of the padded batch's FLOPs", pct) + format(" (%.3g GFLOP against ", packed / 1e9) +
                    format("%.3g GFLOP for ", padded / 1e9) + std::to_string(p.batch) + " x " + std::to_string(p.seq) +
                    (p.kv_seq != p.seq ? " x " + std::to_string(p.kv_seq) : std::string()) + " padded; " +
                    std::to_string(p.total_q()) + " of " + std::to_string(p.batch * p.seq) + " query rows)");
  f.figures = {{"sequences", static_cast<double>(p.batch)},
               {"flops", packed},
               {"padded_flops", padded},
               {"flops_pct_of_padded", pct},
               {"total_q", static_cast<double>(p.total_q())},
               {"padded_q", static_cast<double>(p.batch * p.seq)}};
  return {f};
}

}  // namespace attnprof::analysis
