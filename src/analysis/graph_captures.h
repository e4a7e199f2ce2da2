// What a torch.profiler trace says about CUDA graph captures and nodes, for
// the readers of graph replays (graph_numbering.cpp gives replays their ids
// where the trace has none; graph_replays.cpp ties them to their capture).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnprof/activity.h"

namespace attnprof::analysis {

bool is_device_work(ActivityType t);
// A node's kind, and a captured launch's: 'K' kernel, 'C' memcpy, 'S' memset.
char node_kind(ActivityType t);
// The node a captured host call makes, by its name; 0 for a call that makes
// no node with device work (a host function, an event, a query).
char launch_kind(const Activity& a);
bool begins_capture(const Activity& a);
// A cudaGraphLaunch (or cuGraphLaunch) call with a correlation id: one replay's launch.
bool is_graph_launch(const Activity& a);
bool ends_capture(const Activity& a);

// A capture on one thread: the launch calls between its begin and its end, in order.
struct Window {
  std::int64_t tid = 0;
  std::int64_t from_ns = 0, to_ns = 0;  // the begin call's end, the end call's start
  std::vector<std::size_t> launches;    // indices into the trace
  std::string kinds;                    // their kinds, in order
};

// The captures in the trace, by thread and time, each with its launch calls
// (with_launches) in call order; captures that launched nothing are dropped.
std::vector<Window> capture_windows(const std::vector<Activity>& v, bool with_launches = true);

// Where two device activities under one node id of a graph run different
// work (a node is one launch: its kind and kernel are fixed), the clash, in
// words; empty where they agree.
std::string node_clash(const Activity& x, const Activity& y);

}  // namespace attnprof::analysis
