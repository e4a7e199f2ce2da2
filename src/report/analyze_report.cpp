// What analyze and diff print and write as text and JSON (attnprof/report.h);
// their pages are analyze_html.cpp's.
#include <algorithm>
#include <sstream>

#include "analysis/format.h"
#include "analysis/kernel_names.h"
#include "attnprof/error.h"
#include "attnprof/report.h"
#include "report/json.h"
#include "report/text_table.h"

namespace attnprof {
namespace {

using analysis::bytes_str;
using analysis::format;
using nlohmann::json;
using report::optional_json;
using report_text::count_str;
using report_text::opt;
using report_text::shorten;
using report_text::signed_time;
using report_text::Table;
using report_text::time_str;
using report_text::with_sign;

std::string device_line(const TraceAnalysis& a) {
  if (!a.gpu) return "no GPU events: read as a CPU trace";
  if (!a.device) return "GPU events, but no deviceProperties: occupancy not computed";
  const DeviceProperties& d = *a.device;
  return d.name + format(" (sm%.0f", d.compute_major * 10.0 + d.compute_minor) + format(", %.0f SMs)", d.num_sms);
}

json kernel_row_json(const KernelRow& k) {
  return {{"name", k.name},
          {"count", k.count},
          {"total_us", k.total_us},
          {"pct", k.pct},
          {"occupancy_pct", optional_json(k.occupancy_pct)},
          {"gemm", k.gemm.empty() ? json(nullptr) : json(k.gemm)},
          {"driver_launch", k.driver_launch}};
}

json op_row_json(const OpRow& o) {
  return {{"name", o.name},       {"calls", o.calls},     {"kernels", o.kernels},    {"memcpys", o.memcpys},
          {"memsets", o.memsets}, {"host_us", o.host_us}, {"device_us", o.device_us}};
}

json attention_json(const AttentionSummary& a) {
  json calls = json::array();
  for (const auto& c : a.calls) {
    calls.push_back({{"op", c.op},
                     {"dispatch", c.dispatch},
                     {"backend", c.backend},
                     {"pass", c.backward ? "backward" : "forward"},
                     {"event", c.event},
                     {"shape", c.shape},
                     {"batch", c.problem ? json(c.problem->batch) : json(nullptr)},
                     {"heads", c.problem ? json(c.problem->heads) : json(nullptr)},
                     {"kv_heads", c.problem ? json(c.problem->kv_heads) : json(nullptr)},
                     {"seq", c.problem ? json(c.problem->seq) : json(nullptr)},
                     {"kv_seq", c.problem ? json(c.problem->kv_seq) : json(nullptr)},
                     {"head_dim", c.problem ? json(c.problem->head_dim) : json(nullptr)},
                     {"dtype", c.dtype},
                     {"mask", c.mask},
                     {"scale", optional_json(c.scale)},
                     {"kernels", c.kernels},
                     {"gpu_us", c.gpu_us},
                     {"cpu_us", c.cpu_us},
                     {"flops", optional_json(c.flops)},
                     {"tflops", optional_json(c.tflops)},
                     {"ceiling_pct", optional_json(c.ceiling_pct)},
                     {"share_pct", optional_json(c.share_pct)},
                     {"bytes", optional_json(c.bytes)},
                     {"gbs", optional_json(c.gbs)},
                     {"bandwidth_pct", optional_json(c.bandwidth_pct)},
                     {"graph_id", c.graph_id == 0 ? json(nullptr) : json(c.graph_id)},
                     {"graph_nodes", c.graph_nodes},
                     {"layer", c.layer == 0 ? json(nullptr) : json(c.layer)},
                     {"found_by", c.found_by.empty() ? json(nullptr) : json(c.found_by)}});
  }
  return {{"calls", std::move(calls)},
          {"forward_us", a.forward_us},
          {"backward_us", a.backward_us},
          {"total_us", a.total_us},
          {"forward_pct", optional_json(a.forward_pct)},
          {"backward_pct", optional_json(a.backward_pct)},
          {"missing_shapes", a.missing_shapes.empty() ? json(nullptr) : json(a.missing_shapes)}};
}

// The step's attention calls: one row each, then the share line.
std::string attention_text(const StepAnalysis& s, bool gpu) {
  const AttentionSummary& a = s.attention;
  if (a.calls.empty()) return {};
  std::ostringstream os;
  os << "\n" << s.label << ": attention\n";
  std::vector<std::string> header = {"#", "backend", "pass", "shape", "mask", "dtype"};
  if (gpu) header.emplace_back("kernels");
  for (const char* h : {gpu ? "GPU time" : "CPU time", "TFLOP/s", "ceiling", "share"}) header.emplace_back(h);
  Table t(header);
  int n = 0;
  for (const auto& c : a.calls) {
    std::vector<std::string> cells = {std::to_string(++n),
                                      c.backend,
                                      c.backward ? "backward" : "forward",
                                      c.shape.empty() ? "-" : c.shape,
                                      c.mask.empty() ? "-" : c.mask,
                                      c.dtype.empty() ? "-" : c.dtype};
    if (gpu) cells.push_back(std::to_string(c.kernels.size()));
    for (auto x : {time_str(gpu ? c.gpu_us : c.cpu_us), opt("%.3g", c.tflops), opt("%.0f%%", c.ceiling_pct),
                   opt("%.1f%%", c.share_pct)}) {
      cells.push_back(std::move(x));
    }
    t.add(std::move(cells));
  }
  os << t.str("  ");
  os << "  attention " << (gpu ? "of the step's kernel time" : "of the step's host time") << ": forward "
     << time_str(a.forward_us) << " (" << opt("%.1f%%", a.forward_pct) << "), backward " << time_str(a.backward_us)
     << " (" << opt("%.1f%%", a.backward_pct) << ")\n";
  if (!a.missing_shapes.empty()) os << "  " << a.missing_shapes << "\n";
  return os.str();
}

// analyze --replay: per distinct problem, what ran in the trace and each backend's time against it.
std::string replay_text(const TraceReplay& r) {
  std::ostringstream os;
  os << "\nreplay";
  if (!r.device.empty()) os << " on " << r.device << " (" << r.device_description << ")";
  os << "\n";
  if (!r.note.empty()) os << "  " << r.note << "\n";
  for (const auto& p : r.problems) {
    os << "\n  " << p.label << ": " << p.calls << (p.calls == 1 ? " call" : " calls") << " in the trace (" << p.ran
       << "), " << time_str(p.trace_us) << " a call there\n";
    if (!p.skipped.empty()) {
      os << "    " << p.skipped << "\n";
      continue;
    }
    Table t({"backend", "time", "vs trace", "TFLOP/s", "note"});
    for (const auto& x : p.runs) {
      std::string note = x.backend == p.fastest ? "fastest" : "";
      if (!x.note.empty()) {
        if (!note.empty()) note += "; ";  // appended: GCC 12's -Wrestrict false positive
        note += shorten(x.note, 100);
      }
      t.add({x.backend, x.us ? time_str(*x.us) : "-", opt("%.2fx", x.ratio), opt("%.3g", x.tflops), note});
    }
    os << t.str("    ");
    if (!p.fastest.empty()) {
      const auto it =
          std::find_if(p.runs.begin(), p.runs.end(), [&](const ReplayRun& x) { return x.backend == p.fastest; });
      os << "    fastest: " << p.fastest;
      if (it != p.runs.end() && it->ratio) os << format(", %.2fx the trace's time", *it->ratio);
      os << "\n";
    } else {
      os << "    no backend ran it\n";
    }
  }
  return os.str();
}

json step_json(const StepAnalysis& s) {
  json j = report::result_json(s.result);
  j["label"] = s.label;
  j["source"] = s.result.source;
  j["calls"] = s.result.metrics.steps;
  j["kernels"] = s.kernels;
  j["memcpys"] = s.memcpys;
  j["memsets"] = s.memsets;
  j["memcpy_bytes"] = s.memcpy_bytes;
  j["step_us"] = s.step_us;
  j["device_busy_us"] = s.device_busy_us;
  j["gpu_idle_pct"] = optional_json(s.gpu_idle_pct);
  j["host_us_per_launch"] = optional_json(s.host_us_per_launch);
  j["tensor_core_gemms"] = s.tensor_core_gemms;
  j["cuda_core_gemms"] = s.cuda_core_gemms;
  j["ops"] = json::array();
  for (const auto& o : s.ops) j["ops"].push_back(op_row_json(o));
  j["kernels_by_time"] = json::array();
  for (const auto& k : s.kernels_by_time) j["kernels_by_time"].push_back(kernel_row_json(k));
  j["attention"] = attention_json(s.attention);
  j["graph_id"] = s.graph_id == 0 ? json(nullptr) : json(s.graph_id);
  j["launched_in"] = s.launched_in.empty() ? json(nullptr) : json(s.launched_in);
  return j;
}

json device_props_json(const std::optional<DeviceProperties>& d) {
  if (!d) return nullptr;
  return {{"name", d->name},
          {"compute_capability", std::to_string(d->compute_major) + "." + std::to_string(d->compute_minor)},
          {"sms", d->num_sms},
          {"total_memory_bytes", d->total_global_mem}};
}

json diff_row_json(const DiffRow& r) {
  return {{"name", r.name},
          {"count_a", r.count_a},
          {"count_b", r.count_b},
          {"time_a_us", r.time_a_us},
          {"time_b_us", r.time_b_us},
          {"delta_us", r.delta_us()},
          {"ratio", optional_json(r.ratio())},
          {"change", r.change}};
}

json totals_json(const DiffTotals& t) {
  return {{"steps", t.steps},
          {"step_us", t.step_us},
          {"device_busy_us", t.device_busy_us},
          {"kernels", t.kernels},
          {"memcpys", t.memcpys},
          {"memsets", t.memsets},
          {"memcpy_bytes", t.memcpy_bytes},
          {"peak_bytes", t.peak_bytes}};
}

std::string ratio_str(const DiffRow& r) { return r.ratio() ? format("%.2fx", *r.ratio()) : "new"; }

}  // namespace

json report::replay_json(const TraceReplay& r) {
  json problems = json::array();
  for (const auto& p : r.problems) {
    json runs = json::array();
    for (const auto& x : p.runs) {
      runs.push_back({{"backend", x.backend},
                      {"ran", x.ran},
                      {"us", optional_json(x.us)},
                      {"ratio", optional_json(x.ratio)},
                      {"tflops", optional_json(x.tflops)},
                      {"note", x.note.empty() ? json(nullptr) : json(x.note)}});
    }
    problems.push_back({{"label", p.label},
                        {"problem", p.problem ? report::problem_json(*p.problem) : json(nullptr)},
                        {"ran", p.ran},
                        {"calls", p.calls},
                        {"trace_us", p.trace_us},
                        {"flops", optional_json(p.flops)},
                        {"runs", std::move(runs)},
                        {"fastest", p.fastest.empty() ? json(nullptr) : json(p.fastest)},
                        {"skipped", p.skipped.empty() ? json(nullptr) : json(p.skipped)}});
  }
  return {{"trace_device", r.trace_device},
          {"device", r.device.empty() ? json(nullptr) : json(r.device)},
          {"device_description", r.device_description},
          {"note", r.note.empty() ? json(nullptr) : json(r.note)},
          {"problems", std::move(problems)}};
}

void check_top(std::int64_t top) {
  if (top < 1 || top > kMaxTop) {
    fail(ErrorKind::InvalidArgument,
         "top must be from 1 to " + std::to_string(kMaxTop) + " rows, got " + std::to_string(top), {"top"});
  }
}

std::string analysis_text(const TraceAnalysis& a, int top) {
  std::ostringstream os;
  os << "trace: " << a.path;
  if (!a.trace_name.empty()) os << " (" << a.trace_name << ")";
  os << "\ndevice: " << device_line(a) << "\n";
  os << a.events << " events";
  if (a.events_outside_steps > 0) os << ", " << a.events_outside_steps << " outside every profiler step (not analysed)";
  os << "\n";
  // CUDA graphs: each replay is a step below; how its kernels were tied to the ops captured into it.
  for (const auto& note : a.graph_notes) os << note << "\n";
  os << "\n";

  const bool gpu = a.gpu;
  std::vector<std::string> header = {"step"};
  if (gpu) {
    for (const char* h : {"kernels", "memcpys", "memsets", "GPU busy", "step time", "GPU idle", "host/launch",
                          "TC GEMMs", "occupancy"}) {
      header.emplace_back(h);
    }
  } else {
    for (const char* h : {"top-level ops", "copies", "step time"}) header.emplace_back(h);
  }
  header.emplace_back("peak mem");
  Table t(header, "what the trace shows");
  for (const auto& s : a.steps) {
    const Metrics& m = s.result.metrics;
    std::vector<std::string> cells = {s.label};
    if (gpu) {
      const int gemms = s.tensor_core_gemms + s.cuda_core_gemms;
      cells.insert(cells.end(), {std::to_string(s.kernels), std::to_string(s.memcpys), std::to_string(s.memsets),
                                 time_str(s.device_busy_us), time_str(s.step_us), opt("%.0f%%", s.gpu_idle_pct),
                                 s.host_us_per_launch ? time_str(*s.host_us_per_launch) : "-",
                                 gemms ? format("%.0f", s.tensor_core_gemms) + "/" + std::to_string(gemms) : "-",
                                 opt("%.0f%%", m.occupancy_pct)});
    } else {
      std::size_t ops = 0;
      for (const auto& o : s.ops) ops += static_cast<std::size_t>(o.calls);
      cells.insert(cells.end(), {std::to_string(ops), count_str(m.copies_per_forward * m.steps), time_str(s.step_us)});
    }
    const auto& acts = s.result.trace.activities;
    const bool memory =
        std::any_of(acts.begin(), acts.end(), [](const Activity& x) { return x.type == ActivityType::Allocation; });
    cells.push_back(memory ? bytes_str(static_cast<double>(m.peak_bytes)) : "-");
    std::vector<std::string> said;
    for (const auto& f : s.result.findings) said.push_back(f.text);
    t.add(std::move(cells), std::move(said));
  }
  os << t.str();
  if (gpu) {
    os << "GPU busy: the union of the step's kernels, memcpys and memsets; GPU idle: the gaps between its first\n"
          "and last; host/launch: step time per device activity launched; TC GEMMs: GEMM kernels on tensor cores\n"
          "of all GEMM kernels; occupancy: theoretical, of the longest kernel (each kernel's below).\n";
  }

  for (const auto& s : a.steps) {
    os << attention_text(s, gpu);
    os << "\n" << s.label << ": top-level ops\n";
    Table ops(gpu ? std::vector<std::string>{"op", "calls", "kernels", "memcpys", "memsets", "GPU time", "host time"}
                  : std::vector<std::string>{"op", "calls", "host time"});
    int n = 0;
    for (const auto& o : s.ops) {
      if (n++ >= top) break;
      if (gpu) {
        ops.add({shorten(o.name, 60), std::to_string(o.calls), std::to_string(o.kernels), std::to_string(o.memcpys),
                 std::to_string(o.memsets), time_str(o.device_us), time_str(o.host_us)});
      } else {
        ops.add({shorten(o.name, 60), std::to_string(o.calls), time_str(o.host_us)});
      }
    }
    os << ops.str("  ");
    if (s.ops.size() > static_cast<std::size_t>(top))
      os << "  ... " << s.ops.size() - top << " more (top=N shows them)\n";
    if (!gpu || s.kernels_by_time.empty()) continue;
    os << "\n" << s.label << ": top kernels by time\n";
    Table ks({"time", "share", "count", "occupancy", "GEMM on", "kernel"});
    n = 0;
    for (const auto& k : s.kernels_by_time) {
      if (n++ >= top) break;
      ks.add({time_str(k.total_us), format("%.1f%%", k.pct), std::to_string(k.count),
              opt("%.0f%%", k.occupancy_pct) + (k.driver_launch ? " (driver)" : ""), k.gemm.empty() ? "-" : k.gemm,
              analysis::short_kernel_name(k.name, 90)});
    }
    os << ks.str("  ");
  }
  if (a.replay) os << replay_text(*a.replay);
  return os.str();
}

nlohmann::json report::analysis_json(const std::vector<TraceAnalysis>& analyses) {
  json traces = json::array();
  for (const auto& a : analyses) {
    json steps = json::array();
    for (const auto& s : a.steps) steps.push_back(step_json(s));
    traces.push_back({{"path", a.path},
                      {"trace_name", a.trace_name},
                      {"device", device_props_json(a.device)},
                      {"gpu", a.gpu},
                      {"events", a.events},
                      {"events_outside_steps", a.events_outside_steps},
                      {"steps", std::move(steps)},
                      {"graph_notes", a.graph_notes},
                      {"replay", a.replay ? report::replay_json(*a.replay) : json(nullptr)}});
  }
  return {{"traces", std::move(traces)}};
}

std::string diff_text(const TraceDiff& d, int top) {
  std::ostringstream os;
  os << "A: " << d.a_label << format(" (%.0f step", d.a.steps) << (d.a.steps == 1 ? "" : "s") << ")\n";
  os << "B: " << d.b_label << format(" (%.0f step", d.b.steps) << (d.b.steps == 1 ? "" : "s") << ")\n";
  if (d.a.steps > 1 || d.b.steps > 1) os << "figures per step (averaged over each side's steps)\n";
  os << "\n";
  Table t({"", "A", "B", "delta", "ratio"});
  const auto row = [&](const char* name, double a, double b, bool time, bool bytes) {
    const std::string fa = time ? time_str(a) : bytes ? bytes_str(a) : count_str(a);
    const std::string fb = time ? time_str(b) : bytes ? bytes_str(b) : count_str(b);
    const double dd = b - a;
    const std::string fd = time    ? signed_time(dd)
                           : bytes ? with_sign(dd, bytes_str(std::abs(dd)))
                                   : with_sign(dd, count_str(std::abs(dd)));
    t.add({name, fa, fb, fd, a > 0 ? format("%.2fx", b / a) : "-"});
  };
  row("step time", d.a.step_us, d.b.step_us, true, false);
  row("GPU busy", d.a.device_busy_us, d.b.device_busy_us, true, false);
  row("kernels", d.a.kernels, d.b.kernels, false, false);
  row("memcpys", d.a.memcpys, d.b.memcpys, false, false);
  row("memsets", d.a.memsets, d.b.memsets, false, false);
  row("bytes copied", d.a.memcpy_bytes, d.b.memcpy_bytes, false, true);
  if (d.a.peak_bytes > 0 || d.b.peak_bytes > 0) row("peak memory", d.a.peak_bytes, d.b.peak_bytes, false, true);
  os << t.str();

  const auto names = [&](const char* what, const std::string& change) {
    std::vector<const DiffRow*> list;
    for (const auto& r : d.kernels) {
      if (r.change == change) list.push_back(&r);
    }
    if (list.empty()) return;
    os << "\nkernels " << what << " (" << list.size() << "):\n";
    int n = 0;
    for (const DiffRow* r : list) {
      if (n++ >= top) {
        os << "  ... " << list.size() - top << " more\n";
        break;
      }
      const double count = change == "added" ? r->count_b : r->count_a;
      const double time = change == "added" ? r->time_b_us : r->time_a_us;
      os << "  " << count_str(count) << "x " << time_str(time) << "  " << shorten(r->name, 100) << "\n";
    }
  };
  names("that appeared in B", "added");
  names("that vanished from A", "deleted");

  const auto changes = [&](const char* title, const std::vector<DiffRow>& list) {
    if (list.empty()) return;
    os << "\n" << title << " (largest changes first)\n";
    Table c({"A", "B", "delta", "ratio", "calls A", "calls B", "change", "name"});
    int n = 0;
    for (const auto& r : list) {
      if (n++ >= top) break;
      c.add({time_str(r.time_a_us), time_str(r.time_b_us), signed_time(r.delta_us()), ratio_str(r),
             count_str(r.count_a), count_str(r.count_b), r.change, shorten(r.name, 80)});
    }
    os << c.str("  ");
    if (list.size() > static_cast<std::size_t>(top))
      os << "  ... " << list.size() - top << " more (top=N shows them)\n";
  };
  changes("time per kernel", d.kernels);
  const bool gpu = d.a.kernels + d.a.memcpys + d.a.memsets + d.b.kernels + d.b.memcpys + d.b.memsets > 0;
  changes(gpu ? "GPU time per top-level op" : "host time per top-level op", d.ops);
  if (gpu) changes("host time per top-level op", d.op_host);

  const auto findings = [&](const char* title, const std::vector<Finding>& list) {
    os << "\n" << title << (list.empty() ? ": none\n" : ":\n");
    for (const auto& f : list) os << "  [" << f.rule << "] " << f.text << "\n";
  };
  findings("findings only in A", d.only_a);
  findings("findings only in B", d.only_b);
  return os.str();
}

nlohmann::json report::diff_json(const TraceDiff& d) {
  json j;
  j["a"] = {{"label", d.a_label}, {"totals", totals_json(d.a)}};
  j["b"] = {{"label", d.b_label}, {"totals", totals_json(d.b)}};
  const auto list = [](const std::vector<DiffRow>& rows) {
    json out = json::array();
    for (const auto& r : rows) out.push_back(diff_row_json(r));
    return out;
  };
  j["kernels"] = list(d.kernels);
  j["ops"] = list(d.ops);
  j["op_host"] = list(d.op_host);
  j["kernels_added"] = json::array();
  j["kernels_removed"] = json::array();
  for (const auto& r : d.kernels) {
    if (r.change == "added") j["kernels_added"].push_back(r.name);
    if (r.change == "deleted") j["kernels_removed"].push_back(r.name);
  }
  j["findings_only_a"] = json::array();
  j["findings_only_b"] = json::array();
  for (const auto& f : d.only_a) j["findings_only_a"].push_back(report::finding_json(f));
  for (const auto& f : d.only_b) j["findings_only_b"].push_back(report::finding_json(f));
  return j;
}

std::string analysis_json(const std::vector<TraceAnalysis>& analyses) {
  return report::analysis_json(analyses).dump(2) + "\n";
}

std::string diff_json(const TraceDiff& d) { return report::diff_json(d).dump(2) + "\n"; }

}  // namespace attnprof
