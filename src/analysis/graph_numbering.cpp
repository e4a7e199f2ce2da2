// graph_replays.h: number_graph_replays and number_unnamed_nodes, the ids a
// trace's replays and nodes are read by where it writes none (or none that
// name a node).
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "analysis/graph_captures.h"
#include "analysis/graph_replays.h"

namespace attnprof::analysis {

int number_graph_replays(Trace& trace) {
  auto& v = trace.activities;
  if (std::any_of(v.begin(), v.end(), [](const Activity& a) { return is_device_work(a.type) && a.graph_id != 0; })) {
    return 0;
  }
  // The graph launches, by correlation, in the order they were called.
  std::vector<std::pair<std::int64_t, std::uint64_t>> launches;  // (start, correlation)
  for (const Activity& a : v) {
    if (is_graph_launch(a)) launches.emplace_back(a.start_ns, a.correlation);
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
  // A launch that ran no recorded work makes no replay (tie_graphs counts it),
  // nor hides the short last replay before it (the profiler stopped there).
  std::erase_if(launches, [&work](const auto& l) { return work[l.second].empty(); });
  std::map<std::string, std::pair<std::uint32_t, std::uint64_t>> graph_of;  // sequence -> (graph id, first node id)
  std::uint64_t next_node = 1;
  int numbered = 0;
  for (std::size_t l = 0; l < launches.size(); ++l) {
    std::vector<std::size_t>& w = work[launches[l].second];
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

}  // namespace attnprof::analysis
