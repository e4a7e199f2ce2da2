// analyze: a trace split into its profiler steps, each step a run the rule
// table reads (attnprof/analyze.h).
#include "attnprof/analyze.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <unordered_map>

#include "analysis/attention_calls.h"
#include "analysis/findings.h"
#include "analysis/graph_captures.h"
#include "analysis/graph_replays.h"
#include "analysis/metrics.h"
#include "analysis/normalize.h"
#include "analysis/trace_index.h"
#include "attnprof/environment.h"
#include "attnprof/error.h"

namespace attnprof {
namespace {

using analysis::EventIndex;
using analysis::is_device_work;
using analysis::kNone;
using analysis::TraceIndex;

bool is_launch(ActivityType t) { return t == ActivityType::CudaRuntime || t == ActivityType::CudaDriver; }

std::optional<int> step_number(std::string_view name) {
  if (!name.starts_with(analysis::kProfilerStepPrefix)) return std::nullopt;
  name.remove_prefix(analysis::kProfilerStepPrefix.size());
  int n = 0;
  const auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec != std::errc() || p != name.data() + name.size()) return std::nullopt;
  return n;
}

// The step (position in `spans`, sorted by start) whose span holds `ns`, or -1.
int step_at(const std::vector<std::pair<std::int64_t, std::int64_t>>& spans, std::int64_t ns) {
  const auto it =
      std::upper_bound(spans.begin(), spans.end(), ns, [](std::int64_t t, const auto& s) { return t < s.first; });
  if (it == spans.begin()) return -1;
  return ns <= std::prev(it)->second ? static_cast<int>(std::prev(it) - spans.begin()) : -1;
}

double union_us(std::vector<std::pair<std::int64_t, std::int64_t>> iv, std::optional<double>* idle_pct) {
  if (iv.empty()) return 0;
  std::sort(iv.begin(), iv.end());
  double busy = 0;
  std::int64_t cur_s = iv.front().first, cur_e = iv.front().second, last = cur_e;
  for (const auto& [s, e] : iv) {
    if (s > cur_e) {
      busy += static_cast<double>(cur_e - cur_s);
      cur_s = s;
    }
    cur_e = std::max(cur_e, e);
    last = std::max(last, e);
  }
  busy += static_cast<double>(cur_e - cur_s);
  const double span = static_cast<double>(last - iv.front().first);
  if (idle_pct && span > 0 && iv.size() > 1) *idle_pct = 100.0 * (1.0 - busy / span);
  return busy / 1e3;
}

// The figures of one step, read through its index. `graph`: the step is a
// replay of it, whose device work goes under the ops that captured it.
void breakdown(const TraceIndex& ix, StepAnalysis& s, const analysis::Graph* graph) {
  const auto& v = ix.trace().activities;
  std::int64_t first = 0, last = 0;
  bool any = false;
  for (const auto& a : v) {
    if (a.on_device() || a.type == ActivityType::Allocation) continue;
    first = any ? std::min(first, a.start_ns) : a.start_ns;
    last = any ? std::max(last, a.end_ns()) : a.end_ns();
    any = true;
  }
  s.step_us = any ? static_cast<double>(last - first) / 1e3 : 0;

  std::map<std::string, OpRow> ops;
  for (std::size_t c = 0; c < ix.forwards().size(); ++c) {
    for (EventIndex i : ix.forward_ops(c)) {
      OpRow& row = ops[ix.at(i).name];
      row.calls += 1;
      row.host_us += static_cast<double>(ix.at(i).dur_ns) / 1e3;
    }
  }
  std::map<std::string, KernelRow> kernels;
  std::set<int> replayed_ops;  // captured op instances a replay ran (-1: the untied graph's launch)
  std::vector<std::pair<std::int64_t, std::int64_t>> busy;
  int launched = 0;
  double kernel_us = 0;
  for (EventIndex d : ix.device_activities()) {
    const Activity& a = ix.at(d);
    busy.emplace_back(a.start_ns, a.end_ns());
    const double us = static_cast<double>(a.dur_ns) / 1e3;
    const EventIndex call = ix.launch_call(d);
    launched += call != kNone;
    const EventIndex outer = ix.launching_op(d, /*outermost=*/true);
    const bool replayed = outer == kNone && graph != nullptr && a.graph_id != 0;
    OpRow& row = ops[outer != kNone ? ix.at(outer).name : replayed ? analysis::replay_op(*graph, a) : "(no op)"];
    if (replayed) {
      // A replay's calls of an op: its captured instances that ran (an
      // eager step's op calls, to compare op for op); of the graph itself
      // where untied: one launch.
      const auto c = graph->captured.find(a.graph_node_id);
      const int instance = c != graph->captured.end() ? c->second.outer : -1;
      if (instance >= 0 ? replayed_ops.insert(instance).second : replayed_ops.insert(-1).second) row.calls += 1;
    }
    row.device_us += us;
    if (a.type == ActivityType::Kernel) {
      ++s.kernels;
      ++row.kernels;
      kernel_us += us;
      KernelRow& k = kernels[a.name];
      if (k.count == 0) {
        k.name = a.name;
        if (a.kernel) k.occupancy_pct = a.kernel->occupancy_pct;
        const auto g = analysis::gemm_class(a.name);
        k.gemm = std::string(analysis::gemm_class_name(g));
      }
      ++k.count;
      k.total_us += us;
      k.driver_launch |= call != kNone && ix.at(call).type == ActivityType::CudaDriver;
    } else if (a.type == ActivityType::Memcpy) {
      ++s.memcpys;
      ++row.memcpys;
      s.memcpy_bytes += a.transfer ? static_cast<double>(a.transfer->bytes) : 0;
    } else {
      ++s.memsets;
      ++row.memsets;
    }
  }
  s.device_busy_us = union_us(std::move(busy), &s.gpu_idle_pct);
  if (launched > 0 && s.step_us > 0) s.host_us_per_launch = s.step_us / launched;
  for (auto& [name, row] : ops) {
    row.name = name;
    s.ops.push_back(std::move(row));
  }
  std::stable_sort(s.ops.begin(), s.ops.end(), [](const OpRow& x, const OpRow& y) {
    return std::tie(x.device_us, x.host_us) > std::tie(y.device_us, y.host_us);
  });
  for (auto& [name, k] : kernels) {
    k.pct = kernel_us > 0 ? 100.0 * k.total_us / kernel_us : 0;
    if (k.gemm == "tensor cores" || k.gemm == "TF32 tensor cores") s.tensor_core_gemms += k.count;
    if (k.gemm == "CUDA cores") s.cuda_core_gemms += k.count;
    s.kernels_by_time.push_back(std::move(k));
  }
  std::stable_sort(s.kernels_by_time.begin(), s.kernels_by_time.end(),
                   [](const KernelRow& x, const KernelRow& y) { return x.total_us > y.total_us; });
}

// The option, else the environment variable (a positive number), else
// unknown: every front end the same.
std::optional<double> ceiling_of(const AnalyzeOptions& options) {
  if (options.ceiling_tflops) return options.ceiling_tflops;
  return environment_real("ATTNPROF_CEILING_TFLOPS", kMaxCeilingTflops, "TFLOP/s");
}

std::optional<double> copy_ceiling_of(const AnalyzeOptions& options) {
  if (options.memory_gbs) return options.memory_gbs;
  return environment_real("ATTNPROF_COPY_GBS", kMaxCopyGbs, "GB/s");
}

// `launched_replays`: a host step whose CUDA graph replays are steps of their
// own (their device work and launches went there).
StepAnalysis analyse_step(Trace step_trace, std::string label, const std::string& source, bool gpu,
                          const AnalyzeOptions& options, const analysis::Graph* graph = nullptr,
                          bool launched_replays = false) {
  StepAnalysis s;
  s.label = label;
  RunResult& r = s.result;
  r.backend = std::move(label);
  r.source = source;
  r.eligibility.eligible = true;
  r.problem.device = gpu ? Device::Cuda : Device::Cpu;
  r.trace = std::move(step_trace);
  const TraceIndex ix(r.trace);
  r.metrics = analysis::measure(ix, r.problem, 0);
  // Its own device activities were counted, and are none (those it launched
  // are its replays'), though its GPU annotation span is recorded: not the
  // span-only count of a run with CUPTI off (activities-not-counted).
  if (launched_replays && gpu && !r.metrics.kernels_per_forward) r.metrics.kernels_per_forward = 0.0;
  if (graph != nullptr) {
    // A replay's host time is its launch call's: the step's span runs on to
    // its last kernel, which the host never waited for.
    double host_ns = 0;
    for (const Activity& a : r.trace.activities) {
      if (!a.on_device() && a.type != ActivityType::Allocation) host_ns += static_cast<double>(a.dur_ns);
    }
    r.metrics.host_time_us = host_ns / 1e3;
  }
  // The problem is not known from a trace: no FLOP or byte count, so no
  // TFLOP/s or GB/s.
  r.metrics.tflops.reset();
  r.metrics.ceiling_pct.reset();
  r.metrics.gbs.reset();
  r.metrics.copy_ceiling_pct.reset();
  s.attention = analysis::attention_calls(ix, gpu, ceiling_of(options), graph, copy_ceiling_of(options));
  // Attention ops inside a CUDA graph's capture launched nothing (their
  // kernels run in the replays, counted there): not calls of this step.
  if (const auto spans = analysis::capture_spans(r.trace); !spans.empty()) {
    std::erase_if(s.attention.calls, [&](const AttentionCall& c) {
      if (c.graph_id != 0 || c.event < 0) return false;
      const Activity& op = r.trace.activities[static_cast<std::size_t>(c.event)];
      return std::any_of(spans.begin(), spans.end(), [&](const analysis::CaptureSpan& w) {
        return w.tid == op.tid && op.start_ns >= w.from_ns && op.start_ns <= w.to_ns;
      });
    });
  }
  r.findings = analysis::findings(ix, r, {}, {}, &s.attention.calls, graph);
  breakdown(ix, s, graph);
  if (graph != nullptr) s.graph_id = graph->id;
  return s;
}

}  // namespace

TraceAnalysis analyze_trace(Trace trace, std::string source, const AnalyzeOptions& options) {
  TraceAnalysis out;
  out.path = source;
  out.trace_name = trace.name;
  out.device = trace.device;
  out.events = trace.activities.size();
  auto& v = trace.activities;
  out.gpu = std::any_of(v.begin(), v.end(), [](const Activity& a) { return is_device_work(a.type); });

  // Steps: "ProfilerStep#N" ranges in time order (on the main thread; a
  // nested copy of the name, as some PyTorch versions write, counts once).
  std::vector<std::size_t> steps;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i].type == ActivityType::UserAnnotation && step_number(v[i].name)) steps.push_back(i);
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [&](std::size_t x, std::size_t y) { return v[x].start_ns < v[y].start_ns; });
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;
  std::vector<std::size_t> kept;
  for (std::size_t i : steps) {
    if (!spans.empty() && v[i].start_ns < spans.back().second) continue;  // overlaps the previous step
    spans.emplace_back(v[i].start_ns, v[i].end_ns());
    kept.push_back(i);
  }
  std::vector<std::string> labels;
  for (std::size_t i : kept) labels.push_back(v[i].name);
  if (options.step) {
    const auto it = std::find_if(labels.begin(), labels.end(),
                                 [&](const std::string& l) { return step_number(l) == options.step; });
    if (it == labels.end()) {
      std::string have;
      for (const auto& l : labels) have += (have.empty() ? "" : ", ") + l;
      fail(ErrorKind::InvalidArgument,
           source + " has no ProfilerStep#" + std::to_string(*options.step) +
               (have.empty() ? std::string(" (it has no steps)") : " (it has " + have + ")"));
    }
  }

  // CUDA graphs: each replayed node tied to the op that captured it, on the
  // whole trace before anything moves (a capture may sit in another step).
  if (const int numbered = analysis::number_graph_replays(trace); numbered > 0) {
    out.graph_notes.push_back(
        "the trace carries no graph or node ids (PyTorch 2.11's Kineto with CUDA 13 writes none): " +
        std::to_string(numbered) + " replay" + (numbered == 1 ? "" : "s") +
        " read as the device work under each cudaGraphLaunch, a replay's work numbered as its graph's nodes in "
        "start order");
  }
  for (std::string& n : analysis::number_unnamed_nodes(trace)) out.graph_notes.push_back(std::move(n));
  const analysis::GraphTies ties = analysis::tie_graphs(trace);
  for (const auto& [id, g] : ties.graphs) out.graph_notes.push_back(g.note);
  if (!ties.unrun_launches.empty()) out.graph_notes.push_back(ties.unrun_launches);

  const std::size_t hosts = spans.empty() ? 1 : spans.size();
  std::vector<int> group(v.size(), spans.empty() ? 0 : -1);
  if (!spans.empty()) {
    // Host events by their start; device activities by their launch's step.
    std::unordered_map<std::uint64_t, int> launch_step;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (is_device_work(v[i].type)) continue;
      group[i] = step_at(spans, v[i].start_ns);
      if (is_launch(v[i].type) && v[i].correlation != 0) launch_step.try_emplace(v[i].correlation, group[i]);
    }
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!is_device_work(v[i].type)) continue;
      const auto it = v[i].correlation != 0 ? launch_step.find(v[i].correlation) : launch_step.end();
      group[i] = it != launch_step.end() ? it->second : step_at(spans, v[i].start_ns);
    }
  }
  // Each replay (a graph's device work under one cudaGraphLaunch's
  // correlation id) is a step of its own, after the step it was launched in:
  // its device work and its launch call move there.
  struct Part {
    std::string label;
    int host = -1;  // a replay's: the host step it was launched in
    const analysis::Graph* graph = nullptr;
  };
  std::vector<Part> meta(hosts);
  for (std::size_t g = 0; g < hosts; ++g) meta[g].label = spans.empty() ? std::string("whole trace") : labels[g];
  if (!ties.graphs.empty()) {
    std::map<std::pair<std::uint64_t, std::uint64_t>, std::pair<std::int64_t, int>> replays;  // -> (first start, host)
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!is_device_work(v[i].type) || v[i].graph_id == 0) continue;
      auto [it, added] = replays.try_emplace({v[i].graph_id, v[i].correlation}, v[i].start_ns, group[i]);
      it->second.first = std::min(it->second.first, v[i].start_ns);
    }
    std::vector<std::pair<std::int64_t, std::pair<std::uint64_t, std::uint64_t>>> by_start;
    for (const auto& [key, first] : replays) by_start.emplace_back(first.first, key);
    std::sort(by_start.begin(), by_start.end());
    std::map<std::pair<std::uint64_t, std::uint64_t>, int> part_of;
    std::unordered_map<std::uint64_t, int> part_of_launch;  // by correlation
    std::map<std::uint64_t, int> seen;                      // replays numbered per graph
    for (const auto& [first, key] : by_start) {
      const int host = replays[key].second;
      const int part = host < 0 ? -1 : static_cast<int>(meta.size());
      part_of[key] = part;
      part_of_launch.try_emplace(key.second, part);
      const int n = ++seen[key.first];
      if (host < 0) continue;  // launched outside every step: not analysed, as its step's events are not
      meta.push_back(Part{.label = "graph " + std::to_string(key.first) + " replay " + std::to_string(n),
                          .host = host,
                          .graph = &ties.graphs.at(key.first)});
    }
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (is_device_work(v[i].type) && v[i].graph_id != 0) {
        group[i] = part_of[{v[i].graph_id, v[i].correlation}];
      } else if (analysis::is_graph_launch(v[i])) {
        if (const auto it = part_of_launch.find(v[i].correlation); it != part_of_launch.end()) group[i] = it->second;
      }
    }
  }
  // Times from the trace's start: torch.profiler's base (baseTimeNanoseconds)
  // is the clock's epoch, so its own times read 5.29e12 us from it.
  std::int64_t start = trace.base_ns;
  if (!v.empty()) {
    start = v.front().start_ns;
    for (const Activity& a : v) start = std::min(start, a.start_ns);
  }
  const std::size_t groups = meta.size();
  std::vector<Trace> parts(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    parts[g].device = trace.device;
    parts[g].base_ns = start;
    parts[g].name = trace.name;
    parts[g].collector_note = trace.collector_note;
    parts[g].steps_recorded = 1;
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (group[i] < 0) {
      ++out.events_outside_steps;
      continue;
    }
    parts[static_cast<std::size_t>(group[i])].activities.push_back(std::move(v[i]));
  }
  v.clear();
  v.shrink_to_fit();
  // Each host step, then the replays launched in it.
  std::vector<std::vector<std::size_t>> launched(hosts);
  for (std::size_t g = hosts; g < groups; ++g) launched[static_cast<std::size_t>(meta[g].host)].push_back(g);
  std::vector<std::size_t> order;
  for (std::size_t h = 0; h < hosts; ++h) {
    order.push_back(h);
    order.insert(order.end(), launched[h].begin(), launched[h].end());
  }
  for (const std::size_t g : order) {
    const std::string& host_label =
        meta[g].host < 0 ? meta[g].label : meta[static_cast<std::size_t>(meta[g].host)].label;
    if (options.step && step_number(host_label) != options.step) continue;
    // By start, stably, each activity moved once: sorting the activities
    // themselves moved each about log n times, half of the analysis on the
    // 1M-event trace (docs/perf/analyze-scale.md), as an Activity is large.
    auto& acts = parts[g].activities;
    std::vector<std::size_t> by_time(acts.size());
    std::iota(by_time.begin(), by_time.end(), std::size_t{0});
    std::stable_sort(by_time.begin(), by_time.end(),
                     [&](std::size_t x, std::size_t y) { return acts[x].start_ns < acts[y].start_ns; });
    std::vector<Activity> sorted;
    sorted.reserve(acts.size());
    for (const std::size_t i : by_time) sorted.push_back(std::move(acts[i]));
    acts.swap(sorted);
    Trace().activities.swap(sorted);  // the moved-from shells, freed before the step's analysis
    const bool launches = g < hosts && !launched[g].empty();
    out.steps.push_back(
        analyse_step(std::move(parts[g]), meta[g].label, source, out.gpu, options, meta[g].graph, launches));
    if (meta[g].host >= 0) out.steps.back().launched_in = host_label;
    Trace().activities.swap(parts[g].activities);
  }
  return out;
}

std::vector<TraceAnalysis> analyze_traces(const std::vector<std::filesystem::path>& paths,
                                          const AnalyzeOptions& options) {
  std::vector<TraceAnalysis> out;
  for (const auto& p : paths) out.push_back(analyze_trace(read_chrome_trace(p, options.read), p.string(), options));
  return out;
}

}  // namespace attnprof
