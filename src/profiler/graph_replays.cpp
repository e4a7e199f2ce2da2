// GraphCaptures: graph nodes to the ranges they were captured in, and a
// replay's records rewritten as the eager calls it captured (graph_replays.h).
#include "profiler/graph_replays.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <tuple>
#include <utility>

namespace attnprof {
namespace {

bool is_launch(ActivityType t) { return t == ActivityType::CudaRuntime || t == ActivityType::CudaDriver; }

bool is_range(ActivityType t) { return t == ActivityType::CpuOp || t == ActivityType::UserAnnotation; }

}  // namespace

void GraphCaptures::node_created(std::uint64_t node, std::span<const std::uint64_t> open) {
  if (open.empty()) return;
  std::vector<std::uint64_t> chain(open.begin(), open.end());
  // Nodes of one call share a chain: store each distinct one once (a
  // capture makes a call's nodes one after another: the last chain first).
  auto it = !chains_.empty() && chains_.back() == chain ? chains_.end() - 1
                                                        : std::find(chains_.begin(), chains_.end(), chain);
  if (it == chains_.end()) {
    captured_ids_.insert(chain.begin(), chain.end());
    chains_.push_back(std::move(chain));
    it = chains_.end() - 1;
  }
  node_chain_[node] = static_cast<std::uint32_t>(it - chains_.begin());
}

void GraphCaptures::node_cloned(std::uint64_t original, std::uint64_t clone) {
  const auto it = node_chain_.find(original);
  if (it != node_chain_.end()) node_chain_[clone] = it->second;
}

const std::vector<std::uint64_t>* GraphCaptures::ranges_of(std::uint64_t node) const {
  const auto it = node_chain_.find(node);
  return it == node_chain_.end() ? nullptr : &chains_[it->second];
}

void GraphCaptures::clear() {
  node_chain_.clear();
  chains_.clear();
  captured_ids_.clear();
  captured_.clear();
  steps_.clear();
}

std::size_t GraphCaptures::attribute(Trace& trace) {
  std::vector<Activity>& acts = trace.activities;
  if (node_chain_.empty()) return 0;

  // The ranges open at a capture, as recorded, kept for replays in later
  // steps (a step's range only noted: it is no call).
  std::vector<std::size_t> captured_here;
  for (std::size_t i = 0; i < acts.size(); ++i) {
    const Activity& a = acts[i];
    if (!is_range(a.type) || a.external_id == 0 || !captured_ids_.contains(a.external_id)) continue;
    if (a.type == ActivityType::UserAnnotation && a.name.starts_with("ProfilerStep#")) {
      steps_.insert(a.external_id);
      continue;
    }
    captured_.try_emplace(a.external_id, a);
    captured_here.push_back(i);
  }

  // The launch call of each correlation: the outermost where a runtime call
  // and the driver call inside it share one.
  std::unordered_map<std::uint64_t, std::size_t> launch_of;
  for (std::size_t i = 0; i < acts.size(); ++i) {
    if (!is_launch(acts[i].type) || acts[i].correlation == 0) continue;
    auto [it, fresh] = launch_of.emplace(acts[i].correlation, i);
    if (!fresh && acts[i].dur_ns > acts[it->second].dur_ns) it->second = i;
  }

  // A capture's own ranges launched work that did not run (it was
  // captured): renamed, so that they do not count as calls. A range that
  // launched work that ran (an outer range over eager work or the replays)
  // keeps its name.
  {
    std::unordered_set<std::uint64_t> ran;
    for (const Activity& d : acts) {
      if (d.on_device() && d.correlation != 0) ran.insert(d.correlation);
    }
    for (const std::size_t r : captured_here) {
      Activity& range = acts[r];
      const bool launched_work = std::any_of(launch_of.begin(), launch_of.end(), [&](const auto& entry) {
        const Activity& l = acts[entry.second];
        return l.tid == range.tid && l.start_ns >= range.start_ns && l.end_ns() <= range.end_ns() &&
               ran.contains(entry.first);
      });
      if (!launched_work && !range.name.ends_with(kGraphCaptureSuffix)) range.name += kGraphCaptureSuffix;
    }
  }

  // A replay's device work, by launch: each captured call (the ranges its
  // node was created in, less the step's and those still open around the
  // launch) with its activities, and what no call claims.
  using Chain = std::vector<std::uint64_t>;
  struct Replay {
    std::map<Chain, std::vector<std::size_t>> calls;
    bool unattributed = false;
  };
  std::map<std::size_t, Replay> replays;  // by launch index
  for (std::size_t i = 0; i < acts.size(); ++i) {
    const Activity& d = acts[i];
    if (!d.on_device() || d.graph_node_id == 0) continue;
    const auto launch = launch_of.find(d.correlation);
    if (launch == launch_of.end()) continue;
    const Activity& l = acts[launch->second];
    Replay& r = replays[launch->second];
    const auto node = node_chain_.find(d.graph_node_id);
    Chain chain;
    bool known = node != node_chain_.end();
    for (std::size_t k = 0; known && k < chains_[node->second].size(); ++k) {
      const std::uint64_t id = chains_[node->second][k];
      if (steps_.contains(id)) continue;
      const auto range = captured_.find(id);
      if (range == captured_.end()) {
        known = false;  // never recorded: nothing to show the replay as
        break;
      }
      const Activity& c = range->second;
      if (c.tid == l.tid && c.start_ns <= l.start_ns && c.end_ns() >= l.end_ns()) continue;
      chain.push_back(id);
    }
    if (known && !chain.empty()) {
      r.calls[chain].push_back(i);
    } else {
      r.unattributed = true;
    }
  }

  std::vector<Activity> added;
  std::vector<bool> drop(acts.size(), false);
  std::size_t calls_added = 0;
  for (auto& [li, replay] : replays) {
    if (replay.calls.empty()) continue;
    // The calls in the order they were captured: by their ranges' starts,
    // outermost first, so that the slices of one range lie side by side.
    std::vector<const Chain*> order;
    for (const auto& call : replay.calls) order.push_back(&call.first);
    const auto key = [&](const Chain* c) {
      std::vector<std::pair<std::int64_t, std::uint64_t>> k;
      for (std::uint64_t id : *c) k.emplace_back(captured_.at(id).start_ns, id);
      return k;
    };
    std::sort(order.begin(), order.end(), [&](const Chain* a, const Chain* b) { return key(a) < key(b); });

    const Activity launch = acts[li];
    const std::size_t slices = order.size() + (replay.unattributed ? 1 : 0);
    const auto slice_start = [&](std::size_t s) {
      return launch.start_ns + static_cast<std::int64_t>(static_cast<double>(launch.dur_ns) * static_cast<double>(s) /
                                                         static_cast<double>(slices));
    };
    // Each range of the replay once, spanning the slices of its calls.
    std::map<std::uint64_t, std::size_t> copy_of;  // captured external id -> index into added
    for (std::size_t s = 0; s < order.size(); ++s) {
      const Chain& chain = *order[s];
      const std::int64_t from = slice_start(s);
      const std::int64_t to = slice_start(s + 1);
      for (std::size_t level = 0; level < chain.size(); ++level) {
        auto [it, fresh] = copy_of.emplace(chain[level], added.size());
        if (fresh) {
          Activity r = captured_.at(chain[level]);
          r.start_ns = from;
          r.pid = launch.pid;
          r.tid = launch.tid;
          r.step = launch.step;
          r.depth = launch.depth + static_cast<int>(level);
          r.external_id = next_external_++;
          added.push_back(std::move(r));
          if (level == 0) ++calls_added;
        }
        added[it->second].dur_ns = to - added[it->second].start_ns;
      }
      // The slice of the launch call that stands for this call's launch.
      Activity l = launch;
      l.start_ns = from;
      l.dur_ns = to - from;
      l.depth = launch.depth + static_cast<int>(chain.size());
      l.external_id = added[copy_of.at(chain.back())].external_id;
      l.correlation = (s == 0 && !replay.unattributed) ? launch.correlation : next_correlation_++;
      for (std::size_t d : replay.calls[chain]) {
        acts[d].correlation = l.correlation;
        acts[d].external_id = l.external_id;
      }
      added.push_back(std::move(l));
    }
    if (replay.unattributed) {
      // The last slice stays the launch of what no captured call claims.
      acts[li].start_ns = slice_start(order.size());
      acts[li].dur_ns = launch.end_ns() - acts[li].start_ns;
    } else {
      drop[li] = true;
    }
  }

  if (!added.empty()) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < acts.size(); ++i) {
      if (drop[i]) continue;
      if (kept != i) acts[kept] = std::move(acts[i]);  // a self-move would empty its strings
      ++kept;
    }
    acts.resize(kept);
    acts.insert(acts.end(), std::make_move_iterator(added.begin()), std::make_move_iterator(added.end()));
  }
  std::stable_sort(acts.begin(), acts.end(), [](const Activity& a, const Activity& b) {
    return std::tie(a.start_ns, a.depth) < std::tie(b.start_ns, b.depth);
  });
  return calls_added;
}

}  // namespace attnprof
