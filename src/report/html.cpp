// The HTML report (attnprof/html.h): the runs turned into one JSON document,
// embedded in a page with Plotly.js and the script that draws it
// (report/html_page.h). C++ decides what is shown; the script only lays it out.
#include "attnprof/html.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "analysis/kernel_names.h"
#include "analysis/trace_index.h"
#include "attnprof/error.h"
#include "attnprof/key_averages.h"
#include "attnprof/trace_io.h"
#include "report/html_page.h"
#include "report/html_page_panels.h"
#include "report/json.h"

namespace attnprof {
namespace {

using json = nlohmann::json;
using analysis::EventIndex;
using analysis::kNone;
using analysis::TraceIndex;
using report::optional_json;

// A page stays quick to open with this many timeline bars per run; the rest
// are counted in a note.
constexpr std::size_t kMaxTimelineEvents = 4000;

bool ran(const RunResult& r) { return r.eligibility.eligible && !r.failure && r.metrics.steps > 0; }

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// JSON text that is safe inside <script>: '<', '>' and '&' occur only inside
// strings, where \u escapes mean the same, so no "</script>" or "<!--" can
// end or confuse the element.
std::string script_safe_json(const json& j) {
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else
      out += c;
  }
  return out;
}

// Plotly.js inlined as a script: a "</script" inside it (none today) would
// end the element early; "<\/" means the same to JavaScript in strings,
// regular expressions and comments alike.
std::string script_safe_js(std::string_view js) {
  std::string out;
  out.reserve(js.size() + 64);
  std::size_t from = 0;
  for (std::size_t p = js.find("</"); p != std::string_view::npos; p = js.find("</", p + 2)) {
    out.append(js.substr(from, p + 1 - from));
    out.append("\\");
    from = p + 1;
  }
  out.append(js.substr(from));
  return out;
}

bool is_host_range(const Activity& a) { return !a.on_device() && a.type != ActivityType::Allocation && a.dur_ns >= 0; }

// One profiler step of a run, drawn: the last ProfilerStep (the steadiest),
// or the whole trace when it has none. Host ranges that start inside it, and
// the device activities they launched (or, with no launch recorded, that
// start inside it). Lanes: CPU ranges by thread and nesting depth, device
// activities by device and stream. Times in microseconds from the trace's
// base, as finding evidence gives them.
json timeline_json(const RunResult& r) {
  const Trace& trace = r.trace;
  const TraceIndex index(trace);
  const auto n = static_cast<EventIndex>(trace.activities.size());
  json out = {{"step", nullptr}, {"lanes", json::array()}, {"events", json::array()}, {"left_out", 0}};
  if (n == 0) return out;

  std::int64_t from = trace.activities.front().start_ns;
  std::int64_t to = from;
  for (const Activity& a : trace.activities) to = std::max(to, a.end_ns());
  const auto steps = index.profiler_steps();
  if (!steps.empty()) {
    const Activity& step = index.at(steps.back());
    from = step.start_ns;
    to = step.end_ns();
    out["step"] = step.name;
  }
  const auto inside = [&](std::int64_t t) { return t >= from && t <= to; };

  // Nesting depth from the index's parent links (traces read from files may
  // carry no depth of their own).
  std::vector<int> depth(static_cast<std::size_t>(n), -1);
  const auto depth_of = [&](EventIndex i) {
    std::vector<EventIndex> chain;
    EventIndex j = i;
    while (j != kNone && depth[static_cast<std::size_t>(j)] < 0) {
      chain.push_back(j);
      j = index.parent(j);
    }
    int d = j == kNone ? -1 : depth[static_cast<std::size_t>(j)];
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) depth[static_cast<std::size_t>(*it)] = ++d;
    return depth[static_cast<std::size_t>(i)];
  };

  struct Bar {
    std::tuple<int, std::int64_t, std::int64_t, int> lane;  // (host 0 / device 1, pid or device, tid or stream, depth)
    EventIndex i;
  };
  std::vector<Bar> bars;
  std::set<std::int64_t> threads;
  for (EventIndex i = 0; i < n; ++i) {
    const Activity& a = index.at(i);
    if (a.on_device()) {
      if (a.type == ActivityType::GpuUserAnnotation) continue;
      const EventIndex call = index.launch_call(i);
      const bool keep = call != kNone ? inside(index.at(call).start_ns) : inside(a.start_ns);
      if (keep) bars.push_back({{1, std::max(a.device, 0), a.stream, 0}, i});
    } else if (is_host_range(a) && inside(a.start_ns)) {
      bars.push_back({{0, a.pid, a.tid, depth_of(i)}, i});
      threads.insert(a.tid);
    }
  }
  std::int64_t end = to;
  for (const Bar& b : bars) end = std::max(end, index.at(b.i).end_ns());
  if (bars.size() > kMaxTimelineEvents) {
    // Keep the longest: what a reader looks for first.
    std::nth_element(bars.begin(), bars.begin() + kMaxTimelineEvents, bars.end(),
                     [&](const Bar& x, const Bar& y) { return index.at(x.i).dur_ns > index.at(y.i).dur_ns; });
    out["left_out"] = bars.size() - kMaxTimelineEvents;
    bars.resize(kMaxTimelineEvents);
  }

  std::map<std::tuple<int, std::int64_t, std::int64_t, int>, int> lanes;
  for (const Bar& b : bars) lanes.emplace(b.lane, 0);
  int k = 0;
  for (auto& [lane, id] : lanes) {
    id = k++;
    const auto& [dev, pid, tid, d] = lane;
    std::string name;
    if (dev == 1) {
      name = "GPU " + std::to_string(pid) + " stream " + std::to_string(tid);
    } else {
      name = threads.size() > 1 ? "CPU thread " + std::to_string(tid) + " depth " + std::to_string(d)
                                : "CPU depth " + std::to_string(d);
    }
    out["lanes"].push_back(name);
  }
  const double base = static_cast<double>(index.base_ns());
  for (const Bar& b : bars) {
    const Activity& a = index.at(b.i);
    const bool kernel = a.type == ActivityType::Kernel;
    out["events"].push_back({{"l", lanes[b.lane]},
                             {"n", kernel ? analysis::short_kernel_name(a.name) : a.name},
                             {"f", a.name},
                             {"c", activity_category(a.type)},
                             {"t", (static_cast<double>(a.start_ns) - base) / 1e3},
                             {"d", static_cast<double>(a.dur_ns) / 1e3},
                             {"i", b.i}});
  }
  out["from"] = (static_cast<double>(from) - base) / 1e3;
  out["to"] = (static_cast<double>(end) - base) / 1e3;
  return out;
}

// How the error chart shows a run's error against float64. A log axis cannot
// place 0, and JSON has no NaN (a non-finite rel_error reads null), so the
// state is said outright: "measured" (a relative error > 0), "zero" (exact),
// "nan" (non-finite output elements, or a non-finite error: rel alone, over
// the finite rows, would hide them), "unchecked" (no reference compared).
const char* error_state(const RunResult& r) {
  if (!r.error) return "unchecked";
  if (r.error->nan_count > 0 || !std::isfinite(r.error->rel)) return "nan";
  return r.error->rel > 0 ? "measured" : "zero";
}

json run_json(const HtmlRun& run) {
  const RunResult& r = *run.result;
  json j = report::result_json(r);
  j["label"] = run.label.empty() ? r.backend : run.label;
  j["ran"] = ran(r);
  j["device_type"] = device_name(r.problem.device);
  j["problem"] = report::problem_json(r.problem);
  if (!ran(r)) return j;
  j["error_state"] = error_state(r);
  j["timeline"] = timeline_json(r);
  j["table"] = run.table.empty() ? key_averages_table(r.trace, TableOptions{}) : run.table;
  j["roofline"] = nullptr;
  if (r.metrics.tflops && *r.metrics.tflops > 0) {
    const double bytes = run.bytes_moved.value_or(html_bytes_moved(r));
    const double flops = r.problem.flops();
    if (bytes > 0 && flops > 0) {
      j["roofline"] = {{"flops", flops},
                       {"bytes", bytes},
                       {"intensity", flops / bytes},
                       {"tflops", *r.metrics.tflops},
                       {"modelled", !run.bytes_moved.has_value()}};
    }
  }
  if (!r.trace.collector_note.empty()) j["collector_note"] = r.trace.collector_note;
  if (!run.extra_json.empty()) j["extra"] = json::parse(run.extra_json);
  // Kernels the findings cite, by their short names (the whole one on hover).
  for (auto& f : j["findings"]) {
    for (auto& ev : f["evidence"]) {
      if (ev.value("cat", "") == "kernel" && ev.contains("name")) {
        ev["short"] = analysis::short_kernel_name(ev["name"].get<std::string>());
      }
    }
  }
  return j;
}

json report_json(const HtmlReport& rep) {
  json j;
  j["title"] = rep.title;
  j["subtitle"] = rep.subtitle;
  j["device"] = rep.device;
  j["notes"] = rep.notes;
  j["runs"] = json::array();
  std::optional<double> ceiling, bandwidth_gbs;
  std::string ceiling_from, bandwidth_from;
  for (const HtmlRun& run : rep.runs) {
    if (!run.result) fail(ErrorKind::Internal, "HTML report: run '" + run.label + "' has no result");
    j["runs"].push_back(run_json(run));
    const RunResult& r = *run.result;
    if (!ran(r)) continue;
    if (!ceiling && r.metrics.tflops && r.metrics.ceiling_pct && *r.metrics.ceiling_pct > 0) {
      ceiling = *r.metrics.tflops / (*r.metrics.ceiling_pct / 100.0);
      ceiling_from = j["runs"].back()["label"];
    }
    // The measured copy ceiling where the run has one (what a kernel can
    // reach), else the DRAM's spec peak.
    if (!bandwidth_gbs && r.trace.device && r.trace.device->copy_bandwidth_gbs > 0) {
      bandwidth_gbs = r.trace.device->copy_bandwidth_gbs;
      bandwidth_from = "the measured copy ceiling of " + r.trace.device->name + " (device-to-device, read + written)";
    } else if (!bandwidth_gbs && r.trace.device && r.trace.device->memory_bandwidth_gbs > 0) {
      bandwidth_gbs = r.trace.device->memory_bandwidth_gbs;
      bandwidth_from = "the peak DRAM bandwidth of " + r.trace.device->name + " (memory clock x bus width)";
    }
  }
  j["ceiling_tflops"] = optional_json(ceiling);
  j["ceiling_from"] = ceiling_from;
  j["bandwidth_tbs"] = bandwidth_gbs ? json(*bandwidth_gbs / 1e3) : json(nullptr);
  j["bandwidth_from"] = bandwidth_from;
  j["diff"] = json::array();
  for (const HtmlDiffRow& d : rep.diff) {
    j["diff"].push_back({{"kind", d.kind},
                         {"name", d.name},
                         {"a", optional_json(d.a)},
                         {"b", optional_json(d.b)},
                         {"unit", d.unit},
                         {"note", d.note}});
  }
  j["from_traces"] = rep.from_traces;
  j["diff_a"] = rep.diff_a;
  j["diff_b"] = rep.diff_b;
  return j;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(ErrorKind::Io, "cannot read Plotly.js from " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

double html_bytes_moved(const RunResult& r) {
  const Problem& p = r.problem;
  double bytes =
      static_cast<double>(p.q_bytes()) + static_cast<double>(p.o_bytes()) + 2.0 * static_cast<double>(p.kv_bytes());
  if (r.metrics.ops_per_forward >= 3) {  // a decomposed forward: the scores go through memory
    const double elements = static_cast<double>(p.batch) * static_cast<double>(p.heads) * static_cast<double>(p.seq) *
                            static_cast<double>(p.kv_seq);
    // FP8's composites compute in FP32 after dequantizing.
    const double element =
        r.traits.reference_precision || is_fp8(p.dtype) ? 4.0 : static_cast<double>(element_size(p.dtype));
    bytes += (8.0 + 2.0 * r.metrics.copies_per_forward) * elements * element;
  }
  return bytes;
}

std::string html_report(const HtmlReport& report, std::string_view plotly_js) {
  std::string page;
  page.reserve(plotly_js.size() + 256 * 1024);
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>";
  page += html_escape(report.title.empty() ? "attnprof report" : report.title);
  page += "</title>\n<style>\n";
  page += html_page::kCss;
  page += "</style>\n<script>\n";
  page += html_page::kErrorTrap;  // first, so that errors in Plotly's own load are caught too
  page += "</script>\n<script>\n";
  page += script_safe_js(plotly_js);
  page += "\n</script>\n<script type=\"application/json\" id=\"report-data\">";
  page += script_safe_json(report_json(report));
  page +=
      "</script>\n</head>\n<body data-report-status=\"loading\">\n<noscript>This report draws its charts with "
      "JavaScript; the data is in the report-data element of this file.</noscript>\n<main id=\"report\"></main>\n"
      "<script>\n";
  page += html_page::kScript;
  page += html_page::kScriptPanels;
  page += "</script>\n</body>\n</html>\n";
  return page;
}

std::filesystem::path find_plotly_js() {
  namespace fs = std::filesystem;
  std::vector<fs::path> tried;
  std::error_code ec;
  if (const char* env = std::getenv("ATTNPROF_PLOTLY_JS"); env && *env) {
    tried.emplace_back(env);  // set: the only place looked
  } else {
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) tried.push_back(exe.parent_path().parent_path() / "share" / "attnprof" / "plotly.min.js");
#ifdef ATTNPROF_PLOTLY_JS_SOURCE
    tried.emplace_back(ATTNPROF_PLOTLY_JS_SOURCE);
#endif
  }
  for (const fs::path& p : tried) {
    if (fs::is_regular_file(p, ec)) return p;
  }
  fail(ErrorKind::Unsupported, "the HTML report needs Plotly.js, which is not at " + tried.back().string() +
                                   ": run scripts/setup.sh (it fetches it into third_party/plotly/)");
}

void write_html_report(const HtmlReport& report, const std::filesystem::path& path) {
  const std::string js = read_file(find_plotly_js());
  write_file_atomically(path, html_report(report, js), "HTML report");
}

}  // namespace attnprof
