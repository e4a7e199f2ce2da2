// analyze's and diff's pages (attnprof/report.h): the HtmlReport the page
// template (html_page.h) draws, one run per step, with what the trace holds
// under each (attention calls, the replay, top kernels, memory).
#include <algorithm>

#include "analysis/format.h"
#include "analysis/kernel_names.h"
#include "attnprof/report.h"
#include "report/json.h"

namespace attnprof {

using nlohmann::json;
using report::optional_json;

namespace {

// One run per step, labelled by its trace (when several) and step.
void add_steps(HtmlReport& h, const std::vector<StepAnalysis>& steps, const std::string& prefix) {
  for (const StepAnalysis& s : steps) {
    h.runs.push_back({.label = prefix.empty() ? s.label : prefix + " " + s.label, .result = &s.result});
  }
}

// What the page draws under a step, from what the trace holds: its attention
// calls (each on the roofline where its FLOPs and bytes are known), the
// trace's replay (under its first step), its top kernels' durations, its
// memory over time.
std::string step_extra(const StepAnalysis& s, const TraceAnalysis& a, bool first) {
  const bool gpu = a.gpu;
  json calls = json::array();
  for (const auto& c : s.attention.calls) {
    std::vector<std::string> kernels;
    for (const auto& k : c.kernels) {
      const std::string n = analysis::short_kernel_name(k);
      if (std::find(kernels.begin(), kernels.end(), n) == kernels.end()) kernels.push_back(n);
    }
    json call = {{"op", c.op},
                 {"backend", c.backend},
                 {"pass", c.backward ? "backward" : "forward"},
                 {"shape", c.shape},
                 {"mask", c.mask},
                 {"dtype", c.dtype},
                 {"us", gpu ? c.gpu_us : c.cpu_us},
                 {"tflops", optional_json(c.tflops)},
                 {"share_pct", optional_json(c.share_pct)},
                 {"flops", optional_json(c.flops)},
                 {"kernels", kernels},
                 {"refused", c.refused},
                 {"graph_id", c.graph_id},
                 {"layer", c.layer}};
    // The least traffic the call must move (Problem::io_bytes): its intensity is an upper bound.
    if (c.problem && c.refused.empty() && c.flops) {
      const double bytes = static_cast<double>(c.problem->io_bytes());
      if (bytes > 0) {
        call["bytes"] = bytes;
        call["intensity"] = *c.flops / bytes;
      }
    }
    calls.push_back(std::move(call));
  }
  // A graph replay's panel says how its calls were found (its graph's line).
  std::string said = s.attention.missing_shapes;
  for (const std::string& note : a.graph_notes) {
    if (s.graph_id != 0 && note.starts_with("graph " + std::to_string(s.graph_id) + ":")) {
      said += (said.empty() ? "" : "; ") + note;
    }
  }
  json j;
  j["attention"] = {{"calls", std::move(calls)},
                    {"forward_pct", optional_json(s.attention.forward_pct)},
                    {"backward_pct", optional_json(s.attention.backward_pct)},
                    {"missing_shapes", said},
                    {"time", gpu ? "GPU time" : "host time"}};
  j["bandwidth_tbs"] =
      a.device && a.device->memory_bandwidth_gbs > 0 ? json(a.device->memory_bandwidth_gbs / 1e3) : json(nullptr);
  if (first && a.replay) j["replay"] = report::replay_json(*a.replay);
  // The top kernels, each launch's duration.
  const auto& acts = s.result.trace.activities;
  json kernels = json::array();
  for (std::size_t k = 0; k < s.kernels_by_time.size() && k < 8; ++k) {
    const KernelRow& row = s.kernels_by_time[k];
    json us = json::array();
    for (const Activity& x : acts) {
      if (x.type == ActivityType::Kernel && x.name == row.name && us.size() < 5000) {
        us.push_back(static_cast<double>(x.dur_ns) / 1e3);
      }
    }
    kernels.push_back({{"name", row.name}, {"short", analysis::short_kernel_name(row.name)}, {"us", std::move(us)}});
  }
  j["kernels"] = std::move(kernels);
  // Memory: the allocator's total after each event ([memory] instant events' "Total Allocated").
  json t = json::array(), total = json::array();
  std::size_t n = 0;
  for (const Activity& x : acts) n += x.type == ActivityType::Allocation && x.allocation.has_value();
  const std::size_t stride = n > 4000 ? n / 4000 + 1 : 1;
  std::size_t i = 0;
  for (const Activity& x : acts) {
    if (x.type != ActivityType::Allocation || !x.allocation) continue;
    if (i++ % stride != 0) continue;
    t.push_back(static_cast<double>(x.start_ns - s.result.trace.base_ns) / 1e3);
    total.push_back(static_cast<double>(x.allocation->total_allocated));
  }
  j["memory"] = {{"t", std::move(t)}, {"total", std::move(total)}};
  return j.dump();
}

}  // namespace

HtmlReport analysis_html(const std::vector<TraceAnalysis>& analyses) {
  HtmlReport h;
  h.title = "attnprof analyze";
  h.from_traces = true;
  for (const TraceAnalysis& a : analyses) {
    h.subtitle += (h.subtitle.empty() ? "" : ", ") + a.path;
    if (a.device && h.device.empty()) h.device = a.device->name;
    const std::size_t from = h.runs.size();
    add_steps(h, a.steps, analyses.size() > 1 ? a.path : std::string());
    for (std::size_t i = from; i < h.runs.size(); ++i)
      h.runs[i].extra_json = step_extra(a.steps[i - from], a, i == from);
    if (a.replay && !a.replay->note.empty()) h.notes.push_back("replay: " + a.replay->note);
  }
  return h;
}

HtmlReport diff_html(const TraceDiff& d) {
  HtmlReport h;
  h.title = "attnprof diff";
  h.from_traces = true;
  h.subtitle = d.a_label + " against " + d.b_label;
  h.diff_a = d.a_label;
  h.diff_b = d.b_label;
  const auto rows = [&h](const char* kind, const std::vector<DiffRow>& all) {
    for (const DiffRow& r : all) {
      std::string note = r.change;
      if (const auto ratio = r.ratio()) note += analysis::format(", %.2fx", *ratio);
      h.diff.push_back({.kind = kind, .name = r.name, .a = r.time_a_us, .b = r.time_b_us, .unit = "us", .note = note});
    }
  };
  rows("kernel", d.kernels);
  rows("op", d.ops);
  for (const auto& [side, findings] : {std::pair{"only in A", &d.only_a}, std::pair{"only in B", &d.only_b}}) {
    for (const Finding& f : *findings) h.diff.push_back({.kind = "finding", .name = f.text, .unit = "", .note = side});
  }
  add_steps(h, d.a_steps, "A");
  add_steps(h, d.b_steps, "B");
  return h;
}

}  // namespace attnprof
