// CUDA graph replays in a torch.profiler trace: which op captured each
// replayed kernel, and the attention calls of each replay.
//
// What the trace holds (Kineto, CUDA 12 and later): every kernel, memcpy and
// memset a graph replays carries the correlation id of the host's
// cudaGraphLaunch (one launch, one replay), and, where Kineto writes them,
// "graph id" and "graph node id" in its args (PyTorch 2.11 with CUDA 13
// writes neither: number_graph_replays gives them); no op is above them. If the profiler was on while the graph was
// captured, the captured ops and their launch calls (cudaLaunchKernel,
// cuLaunchKernel, cudaMemcpyAsync, ...) are in the trace between the
// capture's cudaStreamBeginCapture and cudaStreamEndCapture, but those
// launches ran nothing (no device record), and Kineto records no
// node-creation callback: nothing in the trace names a launch's node.
//
// The tie (tie_graphs): CUDA makes a graph's nodes in the order its capture
// launched them, and CUPTI numbers nodes in the order they are made, so the
// k-th node by ascending id of a graph is the k-th launch of its capture.
// A graph is paired with a capture window by the sequence of kinds (kernel,
// memcpy, memset) of its nodes and of the window's launches; several graphs
// and windows with one sequence are paired in order (node ids and capture
// times both grow), and only when they are as many. Each tie is then checked
// by kernel identity where the names allow it: a kernel whose name names an
// attention backend must come from a captured attention op of that backend,
// and no captured attention op may own a kernel that names another.
//
// Refused, each with one line (Graph::note), and then attention is found by
// kernel names alone, without shapes (never a shape made up): no capture in
// the trace for a graph (the profiler was off during capture); captures the
// sequences cannot tell apart; node ids that repeat across graphs; no node
// ids; a node that fails the identity check.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/analyze.h"

namespace attnprof::analysis {

// What a captured launch was made for.
struct CapturedNode {
  // The op it goes under in a replay's op table: its attention call's op, else
  // the outermost op enclosing the launch at capture; empty: none.
  std::string outer_op;
  int outer = -1;  // that op's instance (one per captured call of it), or -1
  int call = -1;   // its attention call in Graph::calls, or -1
};

struct Graph {
  std::uint64_t id = 0;
  int replays = 0;
  std::size_t nodes = 0;                                     // distinct nodes with device work
  bool tied = false;                                         // every node tied to its captured launch
  std::unordered_map<std::uint64_t, CapturedNode> captured;  // by node id, where tied
  // The captured attention calls (where tied): op, backend, shapes, FLOPs as
  // read at capture; graph_nodes filled, kernels and times empty.
  std::vector<AttentionCall> calls;
  bool attention_kernels = false;  // some node's kernel names an attention backend
  std::string note;                // one line: the tie, or why there is none; whether it holds attention
};

struct GraphTies {
  std::map<std::uint64_t, Graph> graphs;  // by graph id
  // One line where graph launches (cudaGraphLaunch, cuGraphLaunch) ran no
  // device work the trace recorded, how many; empty where every one ran some.
  std::string unrun_launches;
};

// PyTorch 2.11's Kineto with CUDA 13 writes no "graph id" or "graph node
// id" (the recorded traces in tests/fixtures/graphs): a replay is then the
// device work under one cudaGraphLaunch's correlation id. This gives such
// work the ids the tie reads: replays that run the same sequence of device
// work (kinds and kernel names) are one graph, numbered in the order of their
// first replay, and a replay's work is its graph's nodes in start order (a
// one-stream capture's launch order), node ids growing across graphs as
// CUDA's do; launches sharing a correlation id are one replay, and a last
// replay whose work is the start of one graph's (a trace that ends inside
// it) is a short replay of that graph. Returns how many replays it numbered:
// 0 where any device activity has a graph id, or nothing was launched by
// cudaGraphLaunch.
int number_graph_replays(Trace& trace);

// A graph whose device work carries its graph id but node ids that name no
// node (none, or one id over two different kernels: a corrupt or foreign
// trace) would put every kernel of a replay under one node, and so under one
// attention call. Its work is numbered as number_graph_replays numbers a
// trace without ids (start order within each replay, ids past every node id
// in the trace), and tie_graphs then judges it as it would those. Returns one
// line per graph so numbered.
std::vector<std::string> number_unnamed_nodes(Trace& trace);

// The spans of the CUDA graph captures in `trace` (thread, from the begin
// call's end to the end call's start): ops there were captured, not run.
struct CaptureSpan {
  std::int64_t tid = 0, from_ns = 0, to_ns = 0;
};
std::vector<CaptureSpan> capture_spans(const Trace& trace);

// Ties every graph replayed in `trace` (the whole trace, before it is split
// into steps) to its capture. No graphs when no device activity has a graph
// id. A replay whose nodes fewer than half of its graph's replays ran (its
// replays disagree) refuses the tie, saying which replay.
GraphTies tie_graphs(const Trace& trace);

// The attention calls of one replay step (its index `ix`, from graph `g`),
// in node order, their layer numbered: the captured calls where the graph is
// tied, else one call per run of kernels that name an attention backend (no
// other kernel between them). `event` is each call's first device activity;
// kernels and times are filled by attention_calls().
std::vector<AttentionCall> replay_calls(const TraceIndex& ix, const Graph& g);

// The op a replayed device activity is put under in a step's op table: the
// op that captured it where the graph is tied, else "(CUDA graph G)".
std::string replay_op(const Graph& g, const Activity& a);

}  // namespace attnprof::analysis
