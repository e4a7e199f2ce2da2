// What the rules of the table share (rules.cpp, rules_parallel.cpp,
// rules_limits.cpp): how a finding is made and cites its events, how a call
// is named ("per forward", "per backward", "per step"), and the trace
// questions several rules ask.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/rules.h"

namespace attnprof::analysis::rule_support {

// Evidence is for pointing at events, not listing a million of them; the
// figures carry the counts.
inline constexpr std::size_t kMaxEvidence = 16;

inline void cite(Finding& f, const TraceIndex& ix, EventIndex i) {
  if (i != kNone && f.evidence.size() < kMaxEvidence) f.evidence.push_back(ix.ref(i));
}

inline Finding found(std::string text) {
  Finding f;
  f.text = std::move(text);
  return f;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

inline bool is_op(const TraceIndex& ix, EventIndex i, std::string_view name) {
  return i != kNone && ix.at(i).type == ActivityType::CpuOp && ix.op(i) == name;
}

// An op called by another op of the same name (aten::matmul calling aten::bmm,
// aten::to calling aten::_to_copy) is one call, counted at the outer one.
inline bool nested_in_same(const TraceIndex& ix, EventIndex i) { return is_op(ix, ix.parent(i), ix.op(i)); }

// Calls per forward of an op (whole calls: a mask built every other forward is not per call).
inline int per_forward(const TraceIndex& ix, std::string_view op, int steps) {
  return static_cast<int>(ix.ops_named(op).size()) / steps;
}

// The ops the first recorded forward called directly.
inline std::span<const EventIndex> first_forward_ops(const TraceIndex& ix) {
  return ix.forwards().empty() ? std::span<const EventIndex>() : ix.forward_ops(0);
}

inline std::vector<std::string> op_names(const TraceIndex& ix) {
  std::vector<std::string> names;
  for (EventIndex i : first_forward_ops(ix)) names.emplace_back(ix.op(i));
  return names;
}

inline void cite_first_forward(Finding& f, const TraceIndex& ix) {
  if (!ix.forwards().empty()) cite(f, ix, ix.forwards().front());
}

// "per forward" (or "per backward", "per train step": the pass the runner's
// call ranges name) in a run's trace; "per step" in a profiler's steps; "in
// the trace" when the whole trace is one call.
inline std::string per_call(const TraceIndex& ix) {
  switch (ix.call_scope()) {
    case TraceIndex::CallScope::Forward: {
      const std::string_view pass = ix.forwards().empty() ? "forward" : std::string_view(ix.at(ix.forwards()[0]).name);
      return pass == "train" ? "per train step" : "per " + std::string(pass);
    }
    case TraceIndex::CallScope::ProfilerStep:
      return "per step";
    case TraceIndex::CallScope::WholeTrace:
      break;
  }
  // A CUDA graph's replay (analyze's replay steps hold nothing but its work and launch).
  const auto dev = ix.device_activities();
  if (!dev.empty() && ix.at(dev.front()).graph_id != 0) return "per replay";
  return "in the trace";
}

inline std::string every_call(const TraceIndex& ix) {
  return ix.call_scope() == TraceIndex::CallScope::ProfilerStep ? "every step" : "every call";
}

// Ops whose whole job is a copy: a copy inside them was asked for.
inline bool is_copy_op(std::string_view op) {
  return op == "copy_" || op == "clone" || op == "to" || op == "contiguous" || op == "_copy_from" ||
         op == "_copy_from_and_resize";
}

// The run the others' memory is read against (the backend that declares
// itself the memory baseline), when it ran.
inline const RunResult* memory_baseline(const std::vector<RunResult>& all) {
  for (const auto& r : all) {
    if (r.traits.memory_baseline && !r.failure && r.metrics.steps > 0) return &r;
  }
  return nullptr;
}

// The longest kernel with a record of its launch configuration.
inline EventIndex heaviest_kernel(const TraceIndex& ix) {
  EventIndex heavy = kNone;
  for (EventIndex d : ix.device_activities()) {
    if (ix.at(d).kernel && (heavy == kNone || ix.at(d).dur_ns > ix.at(heavy).dur_ns)) heavy = d;
  }
  return heavy;
}

}  // namespace attnprof::analysis::rule_support

namespace attnprof::analysis {

// The training story (rules_training.cpp): what the forward saves, what the
// backward recomputes, its time over the forward's, its kernels.
std::vector<Finding> saved_for_backward(const RuleInput& in);
std::vector<Finding> backward_recompute(const RuleInput& in);
std::vector<Finding> backward_over_forward(const RuleInput& in);
std::vector<Finding> backward_kernels(const RuleInput& in);

// The GPU's rules (rules_launch.cpp): a trace's attention problems, one fused
// kernel, low occupancy, cuLaunchKernelEx, CPU-bound and launch-bound calls.
std::vector<Finding> attention_problems(const RuleInput& in);
std::vector<Finding> one_fused_kernel(const RuleInput& in);
std::vector<Finding> low_occupancy(const RuleInput& in);
std::vector<Finding> launch_kernel_ex(const RuleInput& in);
std::vector<Finding> cpu_bound(const RuleInput& in);
std::vector<Finding> launch_bound(const RuleInput& in);

// The context-parallel rules (rules_parallel.cpp), listed in the table.
std::vector<Finding> comm_overlap(const RuleInput& in);
std::vector<Finding> rank_wait(const RuleInput& in);
std::vector<Finding> load_imbalance(const RuleInput& in);

// What limits a run (rules_limits.cpp): the roofline's ceiling, and split-KV decode's splits.
std::vector<Finding> bound(const RuleInput& in);
std::vector<Finding> split_kv(const RuleInput& in);

// CUDA graph replays (rules_graphs.cpp): replayed attention below a stated share of its roof.
std::vector<Finding> graph_attention_roof(const RuleInput& in);

// A packed batch's FLOPs against the padded batch's (rules_varlen.cpp).
std::vector<Finding> packed_batch(const RuleInput& in);

// FP8 runs (rules_fp8.cpp): the descales and the error beside bf16's, e4m3
// saturation, and the composites' dequantize.
std::vector<Finding> fp8_quantization(const RuleInput& in);
std::vector<Finding> fp8_saturation(const RuleInput& in);
std::vector<Finding> fp8_dequantize(const RuleInput& in);

}  // namespace attnprof::analysis
