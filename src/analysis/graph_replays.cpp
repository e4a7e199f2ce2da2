// graph_replays.h: the tie of replayed kernels to their capture, and the
// attention calls of a replay.
#include "analysis/graph_replays.h"

#include <algorithm>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "analysis/attention_calls.h"
#include "analysis/graph_captures.h"
#include "analysis/kernel_names.h"

namespace attnprof::analysis {
namespace {

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

}  // namespace

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
  {
    // Graph launches whose correlation no device work carries (the profiler
    // stopped before it ran, or CUPTI dropped its records): no replay is made
    // for them, and one line counts them. A driver launch inside a launch on
    // its thread (the runtime's own call, traced too) is that launch.
    std::set<std::uint64_t> worked;
    for (const Activity& a : v) {
      if (is_device_work(a.type)) worked.insert(a.correlation);
    }
    std::vector<std::size_t> calls;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (is_graph_launch(v[i])) calls.push_back(i);
    }
    std::sort(calls.begin(), calls.end(), [&](std::size_t x, std::size_t y) {
      return std::tuple(v[x].tid, v[x].start_ns, -v[x].dur_ns) < std::tuple(v[y].tid, v[y].start_ns, -v[y].dur_ns);
    });
    int unrun = 0;
    std::set<std::uint64_t> counted;  // launches sharing a correlation id are one
    for (std::size_t k = 0; k < calls.size();) {
      const Activity& outer = v[calls[k]];
      bool ran_work = false, seen = false;
      std::size_t j = k;
      for (; j < calls.size() && (j == k || (v[calls[j]].tid == outer.tid && v[calls[j]].end_ns() <= outer.end_ns()));
           ++j) {
        ran_work = ran_work || worked.count(v[calls[j]].correlation) > 0;
        seen = seen || counted.count(v[calls[j]].correlation) > 0;
      }
      if (!ran_work && !seen) ++unrun;
      for (std::size_t m = k; m < j; ++m) counted.insert(v[calls[m]].correlation);
      k = j;
    }
    if (unrun > 0) {
      out.unrun_launches = std::to_string(unrun) + (unrun == 1 ? " graph launch" : " graph launches") +
                           " ran no device work the trace recorded (the profiler stopped, or CUPTI dropped " +
                           (unrun == 1 ? "it)" : "them)") + ": no replay is read for " + (unrun == 1 ? "it" : "them");
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

  for (auto& entry : out.graphs) {
    // (Not a structured binding: clang before 16 cannot capture one in a lambda.)
    const std::uint64_t id = entry.first;
    Graph& g = entry.second;
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
    // Each replay (by its first start, as analyze numbers them) and the nodes
    // it ran. A graph's replays run its nodes, all of them unless a record was
    // lost: a node fewer than half of them ran is not the graph's, and the
    // replays that ran one disagree with the others.
    std::vector<std::pair<std::int64_t, const std::set<std::uint64_t>*>> by_start;
    std::map<std::uint64_t, int> runs;  // node -> replays that ran it
    for (auto r = ran.lower_bound({id, 0}); r != ran.end() && r->first.first == id; ++r) {
      by_start.emplace_back(r->second.first, &r->second.second);
      for (const std::uint64_t n : r->second.second) ++runs[n];
    }
    std::sort(by_start.begin(), by_start.end());
    std::set<std::uint64_t> odd;
    for (const auto& [n, count] : runs) {
      if (2 * count < g.replays) odd.insert(n);
    }
    const std::size_t common = g.nodes - odd.size();  // the nodes a replay runs
    const auto ran_odd = [&odd](const std::set<std::uint64_t>& r) {
      return std::any_of(r.begin(), r.end(), [&odd](std::uint64_t n) { return odd.count(n) > 0; });
    };
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
    } else if (!odd.empty()) {
      std::string which;
      int more = 0;
      for (std::size_t k = 0; k < by_start.size(); ++k) {
        if (!ran_odd(*by_start[k].second) || ++more > 3) continue;
        which += (which.empty() ? "" : ", ") + std::string("replay ") + std::to_string(k + 1) + " ran " +
                 std::to_string(by_start[k].second->size()) + " nodes";
      }
      if (more > 3) which += " and " + std::to_string(more - 3) + " more";
      fail(std::to_string(g.replays) + " replays, but its replays disagree: " + which + " where the others ran " +
           std::to_string(common) + " (node " + std::to_string(*odd.begin()) + " is in " +
           std::to_string(runs[*odd.begin()]) + " of its " + std::to_string(g.replays) + " replays" +
           (odd.size() > 1 ? ", and " + std::to_string(odd.size() - 1) + " more nodes in fewer than half" : "") +
           "): the capture of a graph whose replays differ is not known, so it is not tied to a capture; " +
           std::string(kByName));
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
      // Replays that ran fewer nodes than their graph (a record lost, or the trace ends inside one); those that
      // ran a node not the graph's are named above.
      std::string fewer;
      int more = 0;
      for (std::size_t k = 0; k < by_start.size(); ++k) {
        const std::set<std::uint64_t>& r = *by_start[k].second;
        if (r.size() >= common || ran_odd(r)) continue;
        if (++more > 3) continue;
        fewer += (fewer.empty() ? "" : ", ") + std::string("replay ") + std::to_string(k + 1) + " ran " +
                 std::to_string(r.size()) + " of its " + std::to_string(common) + " nodes";
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
