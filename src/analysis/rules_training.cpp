// The training story's rules: what the forward keeps for the backward, what
// the backward recomputes and how it sums dQ, its time against the 2.5x FLOP
// ratio, and the kernels it launched.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/format.h"
#include "analysis/kernel_names.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {

using namespace rule_support;

std::vector<Finding> saved_for_backward(const RuleInput& in) {
  const RunResult& r = in.run;
  const auto& saved = r.metrics.saved_bytes;
  if (!saved) return {};
  const Problem& p = r.problem;
  const double probs = static_cast<double>(p.batch * p.heads * p.seq) * static_cast<double>(p.kv_seq);
  Finding f;
  if (*saved >= probs) {  // at least one byte per probability: the [S, Skv] matrix itself
    f = found("saves " + bytes_str(*saved) + " for the backward: the B*H*S*Skv = " + format("%.0f", probs) +
              " probabilities (" + format("%.1f", *saved / probs) + " bytes each)");
  } else {
    f = found("saves " + bytes_str(*saved) + " for the backward: only each row's log-sum-exp, beside O");
  }
  f.figures = {{"saved_bytes", *saved}, {"probabilities", probs}};
  return {f};
}

std::vector<Finding> backward_recompute(const RuleInput& in) {
  const RunResult& r = in.run;
  if (r.problem.pass == Pass::Forward || !r.traits.backward_recomputes) return {};
  std::string text = "backward recomputes P from the saved log-sum-exp (5 matrix products to the forward's 2)";
  if (r.traits.backward_dq_unordered) {
    text += r.problem.deterministic ? "; dQ in a fixed order (deterministic=true): bitwise repeatable"
                                    : "; dQ summed in the order its blocks finish (atomics): its bits may "
                                      "differ run to run (deterministic=true fixes the order)";
  }
  Finding f = found(std::move(text));
  f.figures = {{"deterministic", r.problem.deterministic ? 1.0 : 0.0}};
  return {f};
}

// Against the 2.5x FLOP ratio: above it the backward runs its matrix products
// at a lower rate than the forward does (the usual case: five products, two
// of them accumulated across tiles, against two).
std::vector<Finding> backward_over_forward(const RuleInput& in) {
  const Metrics& m = in.run.metrics;
  if (in.run.problem.pass != Pass::Backward || !m.device_time_us || !m.forward_device_time_us ||
      *m.forward_device_time_us <= 0) {
    return {};
  }
  const double ratio = *m.device_time_us / *m.forward_device_time_us;
  const double rate = 2.5 / ratio;  // the backward's FLOP rate over the forward's
  Finding f = found(format("backward takes %.2fx the forward's time (", ratio) + format("%.1f us", *m.device_time_us) +
                    " to " + format("%.1f us", *m.forward_device_time_us) + "; its FLOPs are 2.5x, so it runs at " +
                    format("%.2fx", rate) + " the forward's FLOP rate)");
  f.figures = {{"ratio", ratio},
               {"flop_rate_over_forward", rate},
               {"backward_us", *m.device_time_us},
               {"forward_us", *m.forward_device_time_us}};
  return {f};
}

// The kernels the backward launched (inside its op: in a training step, not
// the forward's), each with its share of the backward's device time.
std::vector<Finding> backward_kernels(const RuleInput& in) {
  const RunResult& r = in.run;
  if (!in.gpu || r.problem.pass == Pass::Forward) return {};
  const TraceIndex& ix = in.index;
  struct Kernel {
    std::string name;
    double ns = 0;
    EventIndex first = kNone;
  };
  std::vector<Kernel> kernels;
  double total = 0;
  for (const EventIndex d : ix.device_activities()) {
    const Activity& a = ix.at(d);
    if (a.type != ActivityType::Kernel) continue;
    if (r.problem.pass == Pass::Train) {
      const EventIndex op = ix.launching_op(d, /*outermost=*/true);
      if (op == kNone || ix.op(op).find("backward") == std::string_view::npos) continue;
    }
    const std::string name = kernel_base_name(a.name);
    auto it = std::find_if(kernels.begin(), kernels.end(), [&](const Kernel& k) { return k.name == name; });
    if (it == kernels.end()) it = kernels.insert(kernels.end(), Kernel{name, 0, d});
    it->ns += static_cast<double>(a.dur_ns);
    total += static_cast<double>(a.dur_ns);
  }
  if (kernels.empty() || total <= 0) return {};
  std::string text = "backward kernels: ";
  Finding f;
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    text += (i ? ", " : "") + kernels[i].name + format(" %.0f%%", 100.0 * kernels[i].ns / total);
  }
  f = found(std::move(text));
  for (const Kernel& k : kernels) cite(f, ix, k.first);
  f.figures = {{"kernels", static_cast<double>(kernels.size())}, {"device_ns", total}};
  return {f};
}

}  // namespace attnprof::analysis
