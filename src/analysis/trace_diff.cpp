// diff: two traces, or two steps, side by side (attnprof/analyze.h). Modelled
// on Holistic Trace Analysis's TraceDiff: per name, the counts and durations
// of control (A) and test (B) and their difference, each name marked added,
// deleted, increased, decreased or unchanged (in frequency, as HTA's ops_diff).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "attnprof/analyze.h"
#include "attnprof/error.h"

namespace attnprof {
namespace {

std::vector<StepAnalysis> pick(const TraceAnalysis& t, std::optional<int> step) {
  if (!step) return t.steps;
  std::vector<StepAnalysis> out;
  const std::string want = "ProfilerStep#" + std::to_string(*step);
  for (const auto& s : t.steps) {
    if (s.label == want || s.launched_in == want) out.push_back(s);  // the step, and the graph replays it launched
  }
  if (out.empty()) {
    std::string have;
    for (const auto& s : t.steps) have += (have.empty() ? "" : ", ") + s.label;
    fail(ErrorKind::InvalidArgument, t.path + " has no " + want + " (it has " + have + ")");
  }
  return out;
}

std::string label(const TraceAnalysis& t, std::optional<int> step) {
  return step ? t.path + " ProfilerStep#" + std::to_string(*step) : t.path;
}

// The steps figures are per: the profiler's (or the whole trace), each with
// the CUDA graph replays launched in it folded in, so that an eager trace and
// a graph one compare step for step; replays alone where a side has no other.
double step_count(const std::vector<StepAnalysis>& steps) {
  const auto hosts = std::count_if(steps.begin(), steps.end(), [](const StepAnalysis& s) { return s.graph_id == 0; });
  return static_cast<double>(hosts > 0 ? hosts : static_cast<std::ptrdiff_t>(steps.size()));
}

DiffTotals totals(const std::vector<StepAnalysis>& steps) {
  DiffTotals t;
  t.steps = step_count(steps);
  const bool hosts = std::any_of(steps.begin(), steps.end(), [](const StepAnalysis& s) { return s.graph_id == 0; });
  for (const auto& s : steps) {
    // A replay's span is its launch call's, inside the step that launched it.
    if (!hosts || s.graph_id == 0) t.step_us += s.step_us;
    t.device_busy_us += s.device_busy_us;
    t.kernels += s.kernels;
    t.memcpys += s.memcpys;
    t.memsets += s.memsets;
    t.memcpy_bytes += s.memcpy_bytes;
    t.peak_bytes = std::max(t.peak_bytes, static_cast<double>(s.result.metrics.peak_bytes));
  }
  if (t.steps > 0) {
    for (double* x : {&t.step_us, &t.device_busy_us, &t.kernels, &t.memcpys, &t.memsets, &t.memcpy_bytes}) {
      *x /= t.steps;
    }
  }
  return t;
}

struct Tally {
  double count = 0, time_us = 0;
};

// HTA's ops_diff categories, by frequency: the time columns say how much.
std::string change_of(const DiffRow& r) {
  if (r.count_a == 0 && r.count_b > 0) return "added";
  if (r.count_b == 0 && r.count_a > 0) return "deleted";
  if (r.count_b > r.count_a) return "increased";
  if (r.count_b < r.count_a) return "decreased";
  return "unchanged";
}

std::vector<DiffRow> rows(const std::map<std::string, Tally>& a, const std::map<std::string, Tally>& b, double na,
                          double nb) {
  std::set<std::string> names;
  for (const auto& [n, t] : a) names.insert(n);
  for (const auto& [n, t] : b) names.insert(n);
  std::vector<DiffRow> out;
  for (const auto& n : names) {
    DiffRow r;
    r.name = n;
    if (const auto it = a.find(n); it != a.end()) {
      r.count_a = it->second.count / na;
      r.time_a_us = it->second.time_us / na;
    }
    if (const auto it = b.find(n); it != b.end()) {
      r.count_b = it->second.count / nb;
      r.time_b_us = it->second.time_us / nb;
    }
    r.change = change_of(r);
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const DiffRow& x, const DiffRow& y) { return std::abs(x.delta_us()) > std::abs(y.delta_us()); });
  return out;
}

// A finding's identity across traces: its rule and its text with the
// figures taken out ("hidden copy: masked_fill makes # ... (#.# MiB)"), and
// the unit it counts by (rule_support.h's per_call: "per step" in an eager
// trace, "per replay" in a graph one, ...) read as one.
std::string finding_key(const Finding& f) {
  std::string text = f.text;
  for (const std::string_view unit :
       {"per train step", "per forward", "per backward", "per step", "per replay", "in the trace"}) {
    for (std::size_t at = text.find(unit); at != std::string::npos; at = text.find(unit, at + 1)) {
      text.replace(at, unit.size(), "per call");
    }
  }
  std::string k = f.rule + ":";
  bool in_number = false;
  for (char c : text) {
    const bool digit = std::isdigit(static_cast<unsigned char>(c)) || (in_number && c == '.');
    if (digit) {
      if (!in_number) k += '#';
      in_number = true;
    } else {
      in_number = false;
      k += c;
    }
  }
  return k;
}

std::vector<Finding> only_in(const std::vector<StepAnalysis>& x, const std::vector<StepAnalysis>& y) {
  std::set<std::string> other;
  for (const auto& s : y) {
    for (const auto& f : s.result.findings) other.insert(finding_key(f));
  }
  std::vector<Finding> out;
  std::set<std::string> seen;
  for (const auto& s : x) {
    for (const auto& f : s.result.findings) {
      const std::string k = finding_key(f);
      if (!other.count(k) && seen.insert(k).second) out.push_back(f);
    }
  }
  return out;
}

}  // namespace

TraceDiff diff_analyses(const TraceAnalysis& a, std::optional<int> a_step, const TraceAnalysis& b,
                        std::optional<int> b_step) {
  TraceDiff d;
  d.a_label = label(a, a_step);
  d.b_label = label(b, b_step);
  d.a_steps = pick(a, a_step);
  d.b_steps = pick(b, b_step);
  d.a = totals(d.a_steps);
  d.b = totals(d.b_steps);
  const auto tally = [](const std::vector<StepAnalysis>& steps) {
    std::map<std::string, Tally> kernels, ops, host;
    for (const auto& s : steps) {
      for (const auto& k : s.kernels_by_time) {
        kernels[k.name].count += k.count;
        kernels[k.name].time_us += k.total_us;
      }
      for (const auto& o : s.ops) {
        ops[o.name].count += o.calls;
        ops[o.name].time_us += o.device_us;
        host[o.name].count += o.calls;
        host[o.name].time_us += o.host_us;
      }
    }
    return std::tuple(kernels, ops, host);
  };
  const auto [ka, oa, ha] = tally(d.a_steps);
  const auto [kb, ob, hb] = tally(d.b_steps);
  const double na = std::max(1.0, d.a.steps), nb = std::max(1.0, d.b.steps);
  d.kernels = rows(ka, kb, na, nb);
  // A trace without device activities has no device time to sort ops by.
  const bool gpu = a.gpu || b.gpu;
  d.ops = rows(gpu ? oa : ha, gpu ? ob : hb, na, nb);
  d.op_host = rows(ha, hb, na, nb);
  d.only_a = only_in(d.a_steps, d.b_steps);
  d.only_b = only_in(d.b_steps, d.a_steps);
  return d;
}

TraceDiff diff_traces(const DiffSide& a, const DiffSide& b, const AnalyzeOptions& options) {
  AnalyzeOptions all = options;
  all.step.reset();
  const TraceAnalysis ta = analyze_trace(read_chrome_trace(a.path, options.read), a.path.string(), all);
  if (a.path == b.path) return diff_analyses(ta, a.step, ta, b.step);
  const TraceAnalysis tb = analyze_trace(read_chrome_trace(b.path, options.read), b.path.string(), all);
  return diff_analyses(ta, a.step, tb, b.step);
}

}  // namespace attnprof
