// CUDA graph replays shown as the calls they captured.
//
// A graph's replay is one cudaGraphLaunch on the host and its nodes' kernels
// on the device, with no range above them: a profiler that attributes device
// work by the op around its launch puts every kernel of a decode step under
// that one call. What ties a replayed kernel back to its call is the node it
// ran from: a device collector records, when each node is created (stream
// capture or an explicit add), the recorded ranges open on the creating
// thread, and CUPTI stamps every replayed kernel with its node's id (the
// clone's, for an instantiated graph: clones map to their originals).
//
// GraphCaptures holds that map and rewrites a trace so that each replay reads
// as the eager calls it captured: every captured range (its name, inputs and
// nesting, copied from the range recorded at capture) appears once per
// replay, inside the replay's launch call, which is cut into one slice per
// range that launched captured work (and one for work no range claims), each
// slice the launch of that range's kernels (their correlation and External
// id). Key averages, the Chrome trace and the analysis then count N replays
// of a captured attention as N calls with their kernels, exactly as eager
// calls. A range recorded at the capture whose launches ran nothing (they
// were captured) is renamed "<name> (graph capture)" so that it is not
// counted as a call. Pure bookkeeping over Trace records, so the CPU tests
// drive it with synthetic records.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "attnprof/activity.h"

namespace attnprof {

// The suffix the capture's own ranges get.
inline constexpr const char* kGraphCaptureSuffix = " (graph capture)";

class GraphCaptures {
 public:
  // A graph node was created (stream capture, an explicit add) while `open`
  // (the external ids of the recorded ranges open on the creating thread,
  // outermost first) were open: the ranges its work is replayed in. Of
  // those, a replay leaves out the step's range and any range still open
  // around the replay's launch (an outer range over capture and replays).
  void node_created(std::uint64_t node, std::span<const std::uint64_t> open);
  // `clone` was copied from `original` (instantiation, cudaGraphClone): it
  // belongs to the same ranges, through any number of clones.
  void node_cloned(std::uint64_t original, std::uint64_t clone);

  // The ranges (external ids, outermost first) open when node (or the node
  // it was cloned from) was created; null for one made outside every
  // recorded range or never seen.
  const std::vector<std::uint64_t>* ranges_of(std::uint64_t node) const;
  std::size_t nodes() const { return node_chain_.size(); }
  void clear();

  // Rewrites `trace` (a whole one, or one step of it: captures are kept from
  // one call to the next, so a replay in a later step than its capture still
  // finds the captured ranges) as the header says, and leaves it sorted by
  // start. Replayed work whose node is unknown, or whose ranges were never
  // recorded (a capture outside the recorded steps), stays on its launch,
  // as before. Returns how many replayed calls were added.
  std::size_t attribute(Trace& trace);

 private:
  std::unordered_map<std::uint64_t, std::uint32_t> node_chain_;  // node -> index into chains_
  std::vector<std::vector<std::uint64_t>> chains_;               // distinct range chains
  std::unordered_set<std::uint64_t> captured_ids_;               // every range of a chain
  std::unordered_map<std::uint64_t, Activity> captured_;         // those ranges as recorded
  std::unordered_set<std::uint64_t> steps_;                      // of those, the steps' ranges
  // Ids for what a rewrite adds, apart from the ones CUPTI (32-bit
  // correlations) and the profiler (a counter from 1) hand out, and exact in
  // a double (trace viewers read JSON numbers as doubles).
  std::uint64_t next_correlation_ = std::uint64_t{1} << 40;
  std::uint64_t next_external_ = std::uint64_t{1} << 41;
};

}  // namespace attnprof
