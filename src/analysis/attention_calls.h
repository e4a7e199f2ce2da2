// Attention calls in a trace from elsewhere: which ops are attention, which
// backend ran, what it launched, its shapes and FLOPs (attnprof/analyze.h's
// AttentionCall). Read once per step from its index; the report prints them
// and the rules read them (which upcasts and copies are attention's).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/analyze.h"

namespace attnprof::analysis {

// An op that is attention or part of one: aten's SDPA and its dispatch,
// forward and backward ops; autograd's *AttentionBackward* nodes;
// flex_attention; flash_attn::*; attnprof::attention*.
bool is_attention_op(std::string_view name);
// Torch.compile's ranges around a frame's compilation (dynamo, AOT autograd,
// inductor), under which ops run on fake tensors: "entire_frame_compile" and
// "_compile.compile_inner (dynamo_timed)".
bool is_compile_range(std::string_view name);

struct Graph;

// The calls (outermost attention ops, in trace order) and their share of the
// step. `gpu`: the trace has device activities (time is the kernels'; else the host's).
// `graph`: the step is a replay of this CUDA graph (graph_replays.h), whose
// calls (replay_calls) join the host's. `memory_gbs`: the bandwidth the
// calls' GB/s are read against, where known.
AttentionSummary attention_calls(const TraceIndex& ix, bool gpu, std::optional<double> ceiling_tflops = {},
                                 const Graph* graph = nullptr, std::optional<double> memory_gbs = {});

// The call whose outermost op encloses host event i (or, for a device
// activity, its launch; for device work a graph replayed, the call whose
// graph nodes hold its node): its position in `calls`, or -1.
int attention_call_of(const TraceIndex& ix, const std::vector<AttentionCall>& calls, EventIndex i);

}  // namespace attnprof::analysis
