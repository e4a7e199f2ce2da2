// graph_replays.h: the tie of replayed kernels to their capture, and the
// attention calls of a replay.
#include "analysis/graph_replays.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "analysis/attention_calls.h"
#include "analysis/kernel_names.h"

namespace attnprof::analysis {
namespace {

bool is_device_work(ActivityType t) {
  return t == ActivityType::Kernel || t == ActivityType::Memcpy || t == ActivityType::Memset;
}

// A node's kind, and a captured launch's: 'K' kernel, 'C' memcpy, 'S' memset.
char node_kind(ActivityType t) { return t == ActivityType::Kernel ? 'K' : t == ActivityType::Memcpy ? 'C' : 'S'; }

// The node a captured host call makes, by its name ("cudaLaunchKernel",
// "cuLaunchKernelEx", "cudaMemcpyAsync", "cudaMemsetD32Async"...); 0 for a call
// that makes no node with device work (a host function, an event, a query).
char launch_kind(const Activity& a) {
  if (a.type != ActivityType::CudaRuntime && a.type != ActivityType::CudaDriver) return 0;
  const std::string_view n = a.name;
  const auto has = [&n](std::string_view part) { return n.find(part) != std::string_view::npos; };
  if (has("HostFunc") || has("GraphLaunch")) return 0;
  if (n.starts_with("cudaLaunch") || n.starts_with("cuLaunch")) return 'K';
  if (has("Memcpy") && has("Async")) return 'C';
  if (has("Memset") && has("Async")) return 'S';
  return 0;
}

// CUPTI's runtime callback ids of the capture calls, for a trace whose
// runtime names are "INVALID" (Kineto named only the ids it knew before the
// refactor of its cbid names): cudaStreamBeginCapture(_ptsz) 315, 316,
// cudaStreamBeginCaptureToGraph(_ptsz) 452, 453; cudaStreamEndCapture(_ptsz) 319, 320.
bool begins_capture(const Activity& a) {
  if (a.type == ActivityType::CudaRuntime && (a.cbid == 315 || a.cbid == 316 || a.cbid == 452 || a.cbid == 453)) {
    return true;
  }
  return a.name.starts_with("cudaStreamBeginCapture") || a.name.starts_with("cuStreamBeginCapture");
}

bool ends_capture(const Activity& a) {
  if (a.type == ActivityType::CudaRuntime && (a.cbid == 319 || a.cbid == 320)) return true;
  return a.name.starts_with("cudaStreamEndCapture") || a.name.starts_with("cuStreamEndCapture");
}

// A capture on one thread: the launch calls between its begin and its end, in order.
struct Window {
  std::int64_t tid = 0;
  std::int64_t from_ns = 0, to_ns = 0;  // the begin call's end, the end call's start
  std::vector<std::size_t> launches;    // indices into the trace
  std::string kinds;                    // their kinds, in order
};

std::vector<Window> capture_windows(const std::vector<Activity>& v, bool with_launches = true) {
  std::vector<std::size_t> marks;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (begins_capture(v[i]) || ends_capture(v[i])) marks.push_back(i);
  }
  std::stable_sort(marks.begin(), marks.end(), [&](std::size_t x, std::size_t y) {
    return std::pair(v[x].tid, v[x].start_ns) < std::pair(v[y].tid, v[y].start_ns);
  });
  std::vector<Window> out;
  for (std::size_t k = 0; k + 1 < marks.size(); ++k) {
    const Activity& b = v[marks[k]];
    const Activity& e = v[marks[k + 1]];
    if (!begins_capture(b) || !ends_capture(e) || b.tid != e.tid) continue;
    Window w;
    w.tid = b.tid;
    w.from_ns = b.end_ns();
    w.to_ns = e.start_ns;
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end(),
            [](const Window& x, const Window& y) { return std::pair(x.tid, x.from_ns) < std::pair(y.tid, y.from_ns); });
  if (!with_launches) return out;
  // Each launch call into the window of its thread that holds its start.
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!launch_kind(v[i])) continue;
    const auto it = std::upper_bound(out.begin(), out.end(), std::pair(v[i].tid, v[i].start_ns),
                                     [](const std::pair<std::int64_t, std::int64_t>& t, const Window& w) {
                                       return t < std::pair(w.tid, w.from_ns);
                                     });
    if (it == out.begin()) continue;
    Window& w = *std::prev(it);
    if (w.tid == v[i].tid && v[i].start_ns >= w.from_ns && v[i].start_ns <= w.to_ns) w.launches.push_back(i);
  }
  for (Window& w : out) {
    // In call order; a driver launch inside a runtime launch (the runtime's
    // own call to the driver, where both were traced) makes no second node.
    std::sort(w.launches.begin(), w.launches.end(), [&](std::size_t x, std::size_t y) {
      return std::pair(v[x].start_ns, -v[x].dur_ns) < std::pair(v[y].start_ns, -v[y].dur_ns);
    });
    std::vector<std::size_t> kept;
    for (std::size_t i : w.launches) {
      if (!kept.empty() && v[i].end_ns() <= v[kept.back()].end_ns()) continue;
      kept.push_back(i);
      w.kinds += launch_kind(v[i]);
    }
    w.launches = std::move(kept);
  }
  std::erase_if(out, [](const Window& w) { return w.launches.empty(); });
  std::sort(out.begin(), out.end(), [](const Window& x, const Window& y) { return x.from_ns < y.from_ns; });
  return out;
}

// A kernel's backend, by its name, against the backend its captured op named.
bool same_backend(std::string_view op_backend, std::string_view kernel_backend) {
  if (op_backend.empty() || op_backend == "unknown" || op_backend == "overrideable") return true;
  if (op_backend == kernel_backend || op_backend.starts_with(kernel_backend) ||
      kernel_backend.starts_with(op_backend)) {
    return true;
  }
  return op_backend == "flash_attn" && kernel_backend == "flash";  // the package's kernels are flash_fwd_*
}

constexpr std::string_view kByName = "attention found by kernel names only, without shapes";

// Where two device activities under one node id of a graph run different
// work (a node is one launch: its kind and kernel are fixed), the clash, in
// words; empty where they agree.
std::string node_clash(const Activity& x, const Activity& y) {
  if (x.type == y.type && x.name == y.name) return {};
  return "node " + std::to_string(x.graph_node_id) + " runs both " + short_kernel_name(x.name, 60) + " and " +
         short_kernel_name(y.name, 60);
}

}  // namespace

int number_graph_replays(Trace& trace) {
  auto& v = trace.activities;
  if (std::any_of(v.begin(), v.end(), [](const Activity& a) { return is_device_work(a.type) && a.graph_id != 0; })) {
    return 0;
  }
  // The graph launches, by correlation, in the order they were called.
  std::vector<std::pair<std::int64_t, std::uint64_t>> launches;  // (start, correlation)
  for (const Activity& a : v) {
    if ((a.type == ActivityType::CudaRuntime || a.type == ActivityType::CudaDriver) && a.correlation != 0 &&
        a.name.find("GraphLaunch") != std::string::npos) {
      launches.emplace_back(a.start_ns, a.correlation);
    }
  }
  if (launches.empty()) return 0;
  std::sort(launches.begin(), launches.end());
  // Two launches with one correlation id (a merged or corrupt trace): their
  // work cannot be told apart, so it is one replay, read and counted once.
  {
    std::set<std::uint64_t> seen;
    std::erase_if(launches, [&seen](const auto& l) { return !seen.insert(l.second).second; });
  }
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> work;  // correlation -> device work
  for (const auto& [start, c] : launches) work.try_emplace(c);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!is_device_work(v[i].type)) continue;
    if (const auto it = work.find(v[i].correlation); it != work.end()) it->second.push_back(i);
  }
  std::map<std::string, std::pair<std::uint32_t, std::uint64_t>> graph_of;  // sequence -> (graph id, first node id)
  std::uint64_t next_node = 1;
  int numbered = 0;
  for (std::size_t l = 0; l < launches.size(); ++l) {
    std::vector<std::size_t>& w = work[launches[l].second];
    if (w.empty()) continue;
    std::stable_sort(w.begin(), w.end(), [&](std::size_t x, std::size_t y) { return v[x].start_ns < v[y].start_ns; });
    std::string sequence;
    for (std::size_t i : w) {
      sequence += node_kind(v[i].type);
      sequence += v[i].type == ActivityType::Kernel ? v[i].name : std::string();
      sequence += '\n';
    }
    // The last replay of a trace that ends inside it (a full buffer, the
    // profiler stopped) ran the first nodes of its graph: where its work is
    // the start of exactly one graph's, it is a short replay of that graph,
    // not another graph (tie_graphs names it). Only the last: elsewhere a
    // shorter sequence is a graph of its own.
    if (l + 1 == launches.size() && !graph_of.count(sequence)) {
      auto prefix_of = graph_of.end();
      int matches = 0;
      for (auto g = graph_of.begin(); g != graph_of.end(); ++g) {
        if (g->first.starts_with(sequence)) {
          prefix_of = g;
          ++matches;
        }
      }
      if (matches == 1) {
        for (std::size_t k = 0; k < w.size(); ++k) {
          v[w[k]].graph_id = prefix_of->second.first;
          v[w[k]].graph_node_id = prefix_of->second.second + k;
        }
        ++numbered;
        continue;
      }
    }
    auto [it, added] = graph_of.try_emplace(sequence, static_cast<std::uint32_t>(graph_of.size() + 1), next_node);
    if (added) next_node += w.size();
    for (std::size_t k = 0; k < w.size(); ++k) {
      v[w[k]].graph_id = it->second.first;
      v[w[k]].graph_node_id = it->second.second + k;
    }
    ++numbered;
  }
  return numbered;
}

std::vector<std::string> number_unnamed_nodes(Trace& trace) {
  auto& v = trace.activities;
  struct Ids {
    std::unordered_map<std::uint64_t, std::size_t> first;  // node id -> its first activity
    std::string why;                                       // empty: the ids name nodes
  };
  std::map<std::uint32_t, Ids> graphs;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const Activity& a = v[i];
    if (!is_device_work(a.type) || a.graph_id == 0) continue;
    Ids& g = graphs[a.graph_id];
    if (!g.why.empty()) continue;
    if (a.graph_node_id == 0) {
      g.why = "its device work carries no node id";
      continue;
    }
    const auto [it, added] = g.first.try_emplace(a.graph_node_id, i);
    if (!added) g.why = node_clash(v[it->second], a);
  }
  // New ids past those of the graphs whose ids name nodes (the others' are
  // replaced), or from 1 where that would wrap past 2^64 - 1: an id shared
  // with another graph misattributes nothing (calls are matched by graph and
  // node), and tie_graphs says so.
  std::uint64_t top = 0;
  for (const auto& [id, g] : graphs) {
    if (g.why.empty()) {
      for (const auto& [node, i] : g.first) top = std::max(top, node);
    }
  }
  std::vector<std::string> out;
  std::uint64_t next = top + 1;
  for (const auto& [id, g] : graphs) {
    if (g.why.empty()) continue;
    std::map<std::uint64_t, std::vector<std::size_t>> work;  // correlation (one replay) -> its device work
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (is_device_work(v[i].type) && v[i].graph_id == id) work[v[i].correlation].push_back(i);
    }
    std::size_t most = 0;
    for (const auto& [c, w] : work) most = std::max(most, w.size());
    if (next == 0 || next > std::numeric_limits<std::uint64_t>::max() - most) next = 1;
    for (auto& [c, w] : work) {
      std::stable_sort(w.begin(), w.end(), [&](std::size_t x, std::size_t y) { return v[x].start_ns < v[y].start_ns; });
      for (std::size_t k = 0; k < w.size(); ++k) v[w[k]].graph_node_id = next + k;
    }
    next += most;
    out.push_back("graph " + std::to_string(id) + ": its node ids name no node (" + g.why +
                  "): its work numbered as its nodes in start order within each replay, as in a trace without ids");
  }
  return out;
}

std::vector<CaptureSpan> capture_spans(const Trace& trace) {
  std::vector<CaptureSpan> out;
  for (const Window& w : capture_windows(trace.activities, /*with_launches=*/false)) {
    out.push_back(CaptureSpan{.tid = w.tid, .from_ns = w.from_ns, .to_ns = w.to_ns});
  }
  return out;
}

GraphTies tie_graphs(const Trace& trace) {
  GraphTies out;
  const auto& v = trace.activities;
  // Nodes of each graph (its first device activity per node), replays, and node ids seen in two graphs.
  std::map<std::uint64_t, std::map<std::uint64_t, std::size_t>> nodes;
  std::map<std::uint64_t, std::set<std::uint64_t>> replays;
  std::unordered_map<std::uint64_t, std::uint64_t> owner;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> repeated;  // graph -> (node, other graph)
  std::map<std::uint64_t, std::string> clash;                                 // graph -> a node id over two kernels
  std::map<std::uint64_t, bool> attention;                                    // graph -> a kernel names attention
  // Each replay's (graph, correlation) first start and nodes, for replays that ran fewer than their graph's.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::pair<std::int64_t, std::set<std::uint64_t>>> ran;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const Activity& a = v[i];
    if (!is_device_work(a.type) || a.graph_id == 0) continue;
    const auto [seen, added_node] = nodes[a.graph_id].try_emplace(a.graph_node_id, i);
    if (!added_node && a.graph_node_id != 0 && !clash.count(a.graph_id)) {
      if (std::string c = node_clash(v[seen->second], a); !c.empty()) clash[a.graph_id] = std::move(c);
    }
    replays[a.graph_id].insert(a.correlation);
    bool& att = attention[a.graph_id];
    att = att || (a.type == ActivityType::Kernel && !attention_backend_of_kernel(a.name, true).empty());
    auto [r, added_replay] = ran.try_emplace({a.graph_id, a.correlation}, a.start_ns, std::set<std::uint64_t>{});
    r->second.first = std::min(r->second.first, a.start_ns);
    r->second.second.insert(a.graph_node_id);
    if (a.graph_node_id == 0) continue;
    const auto [it, added] = owner.try_emplace(a.graph_node_id, a.graph_id);
    if (!added && it->second != a.graph_id) {
      repeated.try_emplace(a.graph_id, a.graph_node_id, it->second);
      repeated.try_emplace(it->second, a.graph_node_id, a.graph_id);
    }
  }
  if (nodes.empty()) return out;

  for (const auto& [id, ns] : nodes) {
    Graph& g = out.graphs[id];
    g.id = id;
    g.replays = static_cast<int>(replays[id].size());
    g.nodes = ns.size();
    // Every activity's kernel, not one per node: where node ids name no node, one stands for many.
    g.attention_kernels = attention[id];
  }

  // Graphs by the sequence of their nodes' kinds, in order of their first node.
  std::vector<Window> windows = capture_windows(v);
  std::map<std::string, std::vector<std::uint64_t>> graphs_of;
  std::map<std::string, std::vector<std::size_t>> windows_of;
  {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> by_first;  // (first node, graph)
    for (const auto& [id, ns] : nodes) by_first.emplace_back(ns.begin()->first, id);
    std::sort(by_first.begin(), by_first.end());
    for (const auto& [first, id] : by_first) {
      std::string kinds;
      for (const auto& [node, i] : nodes[id]) kinds += node_kind(v[i].type);
      graphs_of[kinds].push_back(id);
    }
  }
  for (std::size_t w = 0; w < windows.size(); ++w) windows_of[windows[w].kinds].push_back(w);

  // The captured ops: every host event on a capture's thread that overlaps
  // it, indexed once, and their attention calls as read at capture.
  Trace captured;
  std::unordered_map<std::size_t, EventIndex> at_capture;  // trace index -> index in `captured`
  if (!windows.empty()) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      const Activity& a = v[i];
      if (a.on_device() || a.type == ActivityType::Allocation) continue;
      const bool inside = std::any_of(windows.begin(), windows.end(), [&](const Window& w) {
        return w.tid == a.tid && a.start_ns <= w.to_ns && a.end_ns() >= w.from_ns;
      });
      if (!inside) continue;
      at_capture[i] = static_cast<EventIndex>(captured.activities.size());
      captured.activities.push_back(a);
    }
  }
  const TraceIndex cix(captured);
  const AttentionSummary at = attention_calls(cix, /*gpu=*/true);

  for (auto& [id, g] : out.graphs) {
    const auto& ns = nodes[id];
    const auto fail = [&g](std::string why) {
      g.tied = false;
      g.captured.clear();
      g.calls.clear();
      g.note = "graph " + std::to_string(g.id) + ": " + std::move(why);
    };
    const std::string replayed = std::to_string(g.replays) + (g.replays == 1 ? " replay" : " replays") + " of " +
                                 std::to_string(g.nodes) + (g.nodes == 1 ? " node" : " nodes");
    std::string kinds;
    for (const auto& [node, i] : ns) kinds += node_kind(v[i].type);
    if (ns.count(0)) {
      fail(replayed + ", but its device work carries no graph node id: not tied to its capture; " +
           std::string(kByName));
    } else if (const auto c = clash.find(id); c != clash.end()) {
      fail(replayed + ", but " + c->second +
           ": a node id no longer names one launch (its replays differ), so it "
           "is not tied to a capture; " +
           std::string(kByName));
    } else if (const auto r = repeated.find(id); r != repeated.end()) {
      fail(replayed + ", but node ids repeat across graphs (node " + std::to_string(r->second.first) +
           " is also in graph " + std::to_string(r->second.second) +
           "): not tied to a capture, as a node id no longer names one launch; " + std::string(kByName));
    } else if (windows.empty()) {
      fail(replayed +
           ", but no capture is in the trace (no cudaStreamBeginCapture .. cudaStreamEndCapture: the "
           "profiler was off while the graph was captured): " +
           std::string(kByName));
    } else if (!windows_of.count(kinds)) {
      fail(replayed + ", but no capture in the trace launched its " + std::to_string(g.nodes) +
           " nodes' sequence (the profiler was off while it was captured): " + std::string(kByName));
    } else if (graphs_of[kinds].size() != windows_of[kinds].size()) {
      fail(replayed + ", but " + std::to_string(windows_of[kinds].size()) + " captures in the trace launched " +
           "the same sequence as " + std::to_string(graphs_of[kinds].size()) +
           " replayed graphs: which capture made which graph is not known, so none is tied; " + std::string(kByName));
    } else {
      const auto& gs = graphs_of[kinds];
      const std::size_t k = static_cast<std::size_t>(std::find(gs.begin(), gs.end(), id) - gs.begin());
      const Window& w = windows[windows_of[kinds][k]];
      g.tied = true;
      std::map<int, int> call_of;  // captured attention call -> its position in g.calls
      std::size_t n = 0;
      for (const auto& [node, i] : ns) {
        const EventIndex launch = at_capture.at(w.launches[n++]);
        const EventIndex outer = cix.enclosing_op(launch, /*outermost=*/true);
        CapturedNode c;
        if (outer != kNone) {
          c.outer_op = cix.at(outer).name;
          c.outer = outer;
        }
        const int call = attention_call_of(cix, at.calls, launch);
        if (call >= 0) {
          const auto [it, added] = call_of.try_emplace(call, static_cast<int>(g.calls.size()));
          if (added) {
            AttentionCall t = at.calls[static_cast<std::size_t>(call)];
            t.kernels.clear();
            t.gpu_us = 0;
            t.tflops.reset();
            t.ceiling_pct.reset();
            t.share_pct.reset();
            t.event = -1;
            t.graph_id = id;
            t.found_by = "capture";
            g.calls.push_back(std::move(t));
          }
          c.call = it->second;
          g.calls[static_cast<std::size_t>(c.call)].graph_nodes.push_back(node);
          // Under the attention call's own op, whatever encloses it at capture
          // (torch.compile's CompiledFunction, a module's op): attention's
          // kernels go under attention in a replay's op table.
          const AttentionCall& made = at.calls[static_cast<std::size_t>(call)];
          c.outer_op = made.op;
          c.outer = static_cast<int>(made.event);
        }
        g.captured.emplace(node, std::move(c));
      }
      // Kernel identity, where the names say it.
      for (const auto& [node, i] : ns) {
        if (v[i].type != ActivityType::Kernel) continue;
        const std::string kb = attention_backend_of_kernel(v[i].name, true);
        const CapturedNode& c = g.captured.at(node);
        AttentionCall* call = c.call >= 0 ? &g.calls[static_cast<std::size_t>(c.call)] : nullptr;
        // The kernel names what the op did not: SDPA's pick where no dispatch op was recorded, attnprof's
        // backend where torch kept no string argument of its op.
        if (call && !kb.empty() &&
            (call->backend == "unknown" || (call->backend == "attnprof" && kb.starts_with("attnprof:")))) {
          call->backend = kb;
        }
        if (kb.empty() || (call && same_backend(call->backend, kb))) continue;
        // Launched outside any op at capture (a plan's run, which no torch op
        // wraps): nothing to contradict; replay_calls counts it by its name.
        if (!call && c.outer_op.empty()) continue;
        const std::string made_by =
            call ? call->op + " (" + call->backend + ")" : (c.outer_op.empty() ? std::string("no op") : c.outer_op);
        fail(replayed + ", but node " + std::to_string(node) + " runs " + short_kernel_name(v[i].name, 60) + " (" + kb +
             ") where the launch captured in its place was made by " + made_by +
             ": the capture does not match the graph, so it is not tied; " + std::string(kByName));
        break;
      }
      if (g.tied) {
        g.note = "graph " + std::to_string(id) + ": " + replayed + ", each node tied to the launch captured in its " +
                 "place (the k-th node by id to the k-th launch of the capture)";
        if (!g.calls.empty()) {
          g.note += "; " + std::to_string(g.calls.size()) + " attention call" + (g.calls.size() == 1 ? "" : "s") +
                    " a replay, shapes from the capture";
        }
      }
    }
    if (g.tied) {
      // Attention kernels no captured op owns (launched outside any op): counted by name.
      int loose = 0;
      for (const auto& [node, i] : ns) {
        const auto c = g.captured.find(node);
        loose += v[i].type == ActivityType::Kernel && c != g.captured.end() && c->second.call < 0 &&
                 !attention_backend_of_kernel(v[i].name, true).empty();
      }
      if (loose > 0) {
        g.note += "; " + std::to_string(loose) + " attention kernel" + (loose == 1 ? "" : "s") +
                  " a replay launched outside any op at capture (a plan's run: no op records its shapes), "
                  "found by kernel names";
      }
    }
    {
      // Replays that ran fewer nodes than their graph (a record lost, or the trace ends inside one), numbered
      // as analyze numbers a graph's replays: by their first start.
      std::vector<std::pair<std::int64_t, std::size_t>> by_start;  // (first start, nodes it ran)
      for (auto r = ran.lower_bound({id, 0}); r != ran.end() && r->first.first == id; ++r) {
        by_start.emplace_back(r->second.first, r->second.second.size());
      }
      std::sort(by_start.begin(), by_start.end());
      std::string fewer;
      int more = 0;
      for (std::size_t k = 0; k < by_start.size(); ++k) {
        if (by_start[k].second >= g.nodes) continue;
        if (++more > 3) continue;
        fewer += (fewer.empty() ? "" : ", ") + std::string("replay ") + std::to_string(k + 1) + " ran " +
                 std::to_string(by_start[k].second) + " of its " + std::to_string(g.nodes) + " nodes";
      }
      if (more > 3) fewer += " and " + std::to_string(more - 3) + " more";
      if (more > 0) {
        g.note += "; " + fewer + " (a record lost, or the trace ends inside it)" +
                  (g.tied ? ": a call missing a kernel there has no FLOP rate" : "");
      }
    }
    const bool attention = g.tied ? !g.calls.empty() || g.attention_kernels : g.attention_kernels;
    if (!attention) {
      g.note += g.tied ? "; it holds no attention: none of its captured ops is attention"
                       : "; it holds no attention: no kernel of it names an attention backend";
    }
  }
  return out;
}

std::vector<AttentionCall> replay_calls(const TraceIndex& ix, const Graph& g) {
  std::vector<AttentionCall> out;
  // The step's device work of this graph, by node.
  std::vector<EventIndex> work;
  for (EventIndex d : ix.device_activities()) {
    if (ix.at(d).graph_id == g.id) work.push_back(d);
  }
  std::stable_sort(work.begin(), work.end(),
                   [&](EventIndex x, EventIndex y) { return ix.at(x).graph_node_id < ix.at(y).graph_node_id; });
  if (g.tied) {
    std::set<std::uint64_t> present;
    for (EventIndex d : work) present.insert(ix.at(d).graph_node_id);
    std::vector<int> made(g.calls.size(), -1);
    for (EventIndex d : work) {
      const auto c = g.captured.find(ix.at(d).graph_node_id);
      if (c == g.captured.end() || c->second.call < 0) continue;
      int& k = made[static_cast<std::size_t>(c->second.call)];
      if (k < 0) {
        k = static_cast<int>(out.size());
        out.push_back(g.calls[static_cast<std::size_t>(c->second.call)]);
        out.back().event = d;
        // A node of the call that this replay lacks: its captured FLOPs and bytes over part of its kernels' time
        // would be rates made up, so it has none (the shape stays the capture's).
        const auto& mine = out.back().graph_nodes;
        if (!std::all_of(mine.begin(), mine.end(), [&](std::uint64_t n) { return present.count(n) > 0; })) {
          out.back().flops.reset();
          out.back().bytes.reset();
        }
      }
    }
  }
  {
    // Attention kernels no captured op owns (every one where the graph is
    // not tied): a run of kernels that name one attention backend, no other
    // kernel between them (a memset or memcpy may be: a library's
    // workspace), is one call.
    std::string run;  // the open run's backend; empty: none open
    for (EventIndex d : work) {
      const Activity& a = ix.at(d);
      if (a.type != ActivityType::Kernel) continue;
      if (g.tied) {
        const auto c = g.captured.find(a.graph_node_id);
        if (c != g.captured.end() && c->second.call >= 0) {
          run.clear();
          continue;
        }
      }
      const std::string b = attention_backend_of_kernel(a.name, true);
      if (b.empty()) {
        run.clear();
        continue;
      }
      if (b != run) {
        AttentionCall c;
        c.op = g.tied ? "(captured outside any op)" : "(CUDA graph " + std::to_string(g.id) + ")";
        c.backend = b;
        c.event = d;
        c.graph_id = g.id;
        c.found_by = "kernel names";
        out.push_back(std::move(c));
        run = b;
      }
      out.back().graph_nodes.push_back(a.graph_node_id);
    }
  }
  // Every node of the call's (the tied calls list theirs already); in node order, layers from 1.
  for (AttentionCall& c : out) std::sort(c.graph_nodes.begin(), c.graph_nodes.end());
  std::stable_sort(out.begin(), out.end(), [](const AttentionCall& x, const AttentionCall& y) {
    return x.graph_nodes.front() < y.graph_nodes.front();
  });
  for (std::size_t k = 0; k < out.size(); ++k) out[k].layer = static_cast<int>(k + 1);
  return out;
}

std::string replay_op(const Graph& g, const Activity& a) {
  if (g.tied) {
    const auto c = g.captured.find(a.graph_node_id);
    if (c != g.captured.end() && !c->second.outer_op.empty()) return c->second.outer_op;
    if (c != g.captured.end()) return "(captured outside any op)";
  }
  return "(CUDA graph " + std::to_string(g.id) + ")";
}

}  // namespace attnprof::analysis
