// The rules, each one function that reads the trace the way the reference
// study read its traces, and the one table that lists them. Rules read the
// index's normalised names and the backend's Traits, never backend names.
// Here: expectations and guesses, copies, the math path's habits, output
// health and memory; the other families in rules_<family>.cpp (declared in
// rule_support.h).
#include "analysis/rules.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "analysis/attention_calls.h"
#include "analysis/format.h"
#include "analysis/graph_replays.h"
#include "analysis/kernel_names.h"
#include "analysis/normalize.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {
namespace {

using namespace rule_support;

// ---- Guess first, then look: the backend's declared expectation and the user's.

std::vector<Finding> expectation_mismatch(const RuleInput& in) {
  const RunResult& r = in.run;
  const Metrics& m = r.metrics;
  if (!in.gpu || r.expectation.device_activities < 0 || !m.kernels_per_forward ||
      std::abs(*m.kernels_per_forward - r.expectation.device_activities) <= 0.01) {
    return {};
  }
  const TraceIndex& ix = in.index;
  Finding f = found(format("expected %.0f GPU activities ", r.expectation.device_activities) + per_call(ix) +
                    format(", saw %.0f", *m.kernels_per_forward));
  // Name what the guess missed: memsets a library issued, and where from.
  std::map<std::string, std::vector<EventIndex>> memsets;
  for (EventIndex d : ix.device_activities()) {
    if (ix.at(d).type != ActivityType::Memset) continue;
    const EventIndex op = ix.launching_op(d);
    memsets[op == kNone ? std::string("(no op)") : std::string(ix.op(op))].push_back(d);
  }
  for (const auto& [op, events] : memsets) {
    f.text += format(": +%.0f memset", static_cast<double>(events.size()) / in.steps) + " launched inside " + op +
              " (the library zeroes a workspace)";
    for (EventIndex d : events) cite(f, ix, d);
  }
  if (memsets.empty() && !ix.forwards().empty()) {
    for (EventIndex d : ix.forward_device(0)) cite(f, ix, d);
  }
  f.figures = {{"expected_per_forward", r.expectation.device_activities},
               {"seen_per_forward", *m.kernels_per_forward},
               {"memsets_per_forward", m.memsets_per_forward}};
  return {f};
}

std::vector<Finding> op_sequence_mismatch(const RuleInput& in) {
  const auto& expected = in.run.expectation.cpu_ops;
  const auto ops = op_names(in.index);
  if (expected.empty() || ops == expected) return {};
  Finding f = found("expected ops [" + join(expected) + "], saw [" + join(ops) + "]");
  for (EventIndex i : first_forward_ops(in.index)) cite(f, in.index, i);
  f.figures = {{"expected_ops", static_cast<double>(expected.size())}, {"seen_ops", static_cast<double>(ops.size())}};
  return {f};
}

std::vector<Finding> user_guess(const RuleInput& in, bool confirmed) {
  const auto g = in.guesses.find(in.run.backend);
  if (g == in.guesses.end()) return {};
  const Metrics& m = in.run.metrics;
  if (in.gpu && !m.kernels_per_forward) return {};  // nothing counted: activities-not-counted says so
  const double seen = in.gpu ? *m.kernels_per_forward : m.ops_per_forward;
  if ((std::abs(seen - g->second) < 0.01) != confirmed) return {};
  const char* what = in.gpu ? "GPU activities" : "ops";
  Finding f =
      found(std::string(confirmed ? "guess confirmed: " : "guess missed: ") + format("you expected %.0f ", g->second) +
            what + " " + per_call(in.index) + format(", the trace shows %.1f", seen));
  cite_first_forward(f, in.index);
  f.figures = {{"guess_per_forward", g->second}, {"seen_per_forward", seen}};
  return {f};
}

// With CUPTI off (ATTNPROF_NO_CUPTI=1, another profiler attached) only a
// device-event span per forward was recorded: no kernel, copy or memset was
// counted, so no count can be compared with a guess or an expectation.
std::vector<Finding> activities_not_counted(const RuleInput& in) {
  const Metrics& m = in.run.metrics;
  if (!in.gpu || m.kernels_per_forward) return {};
  std::string why = in.run.trace.collector_note;
  if (const auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
  Finding f = found("GPU activities not counted" + (why.empty() ? std::string() : ": " + why) +
                    "; the expected count and any guess (expect=) are not checked");
  cite_first_forward(f, in.index);
  return {f};
}

std::vector<Finding> guess_confirmed(const RuleInput& in) { return user_guess(in, true); }
std::vector<Finding> guess_missed(const RuleInput& in) { return user_guess(in, false); }

// ---- Copies: where they came from (the op that launched or ran them) and their bytes.

struct CopyGroup {
  std::vector<EventIndex> events;  // the op first, then the copies
  double copies = 0;
  double bytes = 0;
  bool outside_attention = false;  // a trace from elsewhere: the model's copy, not attention's
};

// In a trace from elsewhere, an event outside every attention call is the
// model's business (autograd's view backward, RMSNorm's upcast): information.
// In a run every event is the attention's.
// attnprof's own trace read back from a file: its runner's call ranges hold
// nothing but attention.
bool outside_attention(const RuleInput& in, EventIndex i) {
  if (in.attention == nullptr) return false;
  if (in.index.call_scope() == TraceIndex::CallScope::Forward && in.index.forward_of(i) >= 0) return false;
  return attention_call_of(in.index, *in.attention, i) < 0;
}

// Groups by (outside attention, where).
using CopyGroups = std::map<std::pair<bool, std::string>, CopyGroup>;

std::vector<Finding> copy_findings(const RuleInput& in, const CopyGroups& groups, bool device) {
  std::vector<Finding> out;
  for (const auto& [key, g] : groups) {
    const std::string& op = key.second;
    const double bytes = g.bytes / in.steps;
    const std::string per = per_call(in.index);
    Finding f = found(device ? "hidden copy: " + op + " makes " + format("%.0f", g.copies / in.steps) +
                                   " device-to-device copy " + per + " (" + mib(bytes) + ")"
                             : "hidden copy: " + op + " (out of place) allocates and copies " + mib(bytes) + " " + per);
    if (g.outside_attention) {
      f.text += ", outside attention";
    } else {
      f.severity = Severity::Warning;
    }
    for (EventIndex i : g.events) cite(f, in.index, i);
    f.figures = {{"copies_per_forward", g.copies / in.steps}, {"bytes_per_forward", bytes}};
    out.push_back(std::move(f));
  }
  return out;
}

// GPU: a device-to-device memcpy, or any copy launched by a copy_, inside an
// op that is not itself a copy (copy_, clone, to, contiguous): each
// attributed to the op the call made (and the op inside it that launched it).
std::vector<Finding> hidden_copy_device(const RuleInput& in) {
  const TraceIndex& ix = in.index;
  CopyGroups by_op;
  for (EventIndex d : ix.device_activities()) {
    const Activity& a = ix.at(d);
    const EventIndex outer = ix.launching_op(d, /*outermost=*/true);
    const EventIndex inner = ix.launching_op(d);
    const bool under_copy = inner != kNone && ix.op(inner) == "copy_";
    const bool dtod = a.type == ActivityType::Memcpy && (!a.transfer || a.transfer->kind.empty() ||
                                                         a.transfer->kind == "DtoD" || a.transfer->kind == "PtoP");
    if (!(a.type == ActivityType::Memcpy && (dtod || under_copy)) && !(a.type == ActivityType::Kernel && under_copy)) {
      continue;
    }
    if (outer != kNone && is_copy_op(ix.op(outer))) continue;  // a copy asked for
    // A replay's copy: the op that captured its launch (aten::copy_ of a
    // static input, say), as the op table names it.
    std::string captured;
    if (outer == kNone && in.graph != nullptr && a.graph_id != 0) captured = replay_op(*in.graph, a);
    if (!captured.empty() && is_copy_op(std::string_view(captured).substr(captured.starts_with("aten::") ? 6 : 0))) {
      continue;  // asked for at capture
    }
    // A dtype conversion's copy_ (to -> _to_copy -> copy_ inside PyTorch's
    // math path): the upcast rule's business, not a hidden copy.
    if (under_copy && ix.is_conversion_copy(inner)) continue;
    std::string where = outer != kNone ? std::string(ix.op(outer)) : captured.empty() ? "(no op)" : captured;
    if (inner != kNone && inner != outer) where += " (its " + std::string(ix.op(inner)) + ")";
    const bool outside = outside_attention(in, d);
    auto& g = by_op[{outside, where}];
    g.outside_attention = outside;
    if (g.events.empty() && outer != kNone) g.events.push_back(outer);
    g.events.push_back(d);
    g.copies += 1;
    g.bytes += a.transfer ? static_cast<double>(a.transfer->bytes) : 0;
  }
  return copy_findings(in, by_op, /*device=*/true);
}

// CPU: a copy_ nested in another op, and the bytes allocated for it (from the
// op's start to the copy's end).
std::vector<Finding> hidden_copy_host(const RuleInput& in) {
  const TraceIndex& ix = in.index;
  CopyGroups by_parent;
  for (EventIndex c : ix.ops_named("copy_")) {
    if (ix.is_conversion_copy(c)) continue;
    const EventIndex parent = ix.copy_owner(c);
    // A copy called for at the top level, or by an op whose job is copying, was asked for.
    if (!in.run.source.empty() && (parent == kNone || is_copy_op(ix.op(parent)))) continue;
    const bool outside = outside_attention(in, c);
    auto& g = by_parent[{outside, parent != kNone ? std::string(ix.op(parent)) : std::string("(top level)")}];
    g.outside_attention = outside;
    if (parent != kNone) {
      if (g.events.empty()) g.events.push_back(parent);
      g.bytes += ix.allocated_bytes_between(ix.at(parent).start_ns, ix.at(c).end_ns());
    }
    g.events.push_back(c);
    g.copies += 1;
  }
  return copy_findings(in, by_parent, /*device=*/false);
}

std::vector<Finding> hidden_copy(const RuleInput& in) { return in.gpu ? hidden_copy_device(in) : hidden_copy_host(in); }

std::vector<Finding> masked_fill_in_place(const RuleInput& in) {
  const Metrics& m = in.run.metrics;
  const TraceIndex& ix = in.index;
  std::vector<EventIndex> fills;
  for (EventIndex i : first_forward_ops(ix)) {
    if (ix.op(i) == "masked_fill_") fills.push_back(i);
  }
  if (m.copies_per_forward != 0 || fills.empty()) return {};
  Finding f = found("masked fill runs in place: no copy");
  for (EventIndex i : fills) cite(f, ix, i);
  if (const RunResult* base = memory_baseline(in.all); base && base->metrics.allocated_bytes_per_forward > 0) {
    const double saved = base->metrics.allocated_bytes_per_forward - m.allocated_bytes_per_forward;
    if (saved > 0) {
      f.text += ", " + mib(saved) + " less allocated " + per_call(ix) + " than " + base->backend;
      f.figures["saved_bytes_per_forward"] = saved;
    }
    if (base->metrics.device_time_us && m.device_time_us) {
      const double ratio = *m.device_time_us / *base->metrics.device_time_us;
      f.text += format(", %.2fx ", ratio) + base->backend + "'s time";
      f.figures["time_vs_baseline"] = ratio;
    }
  }
  return {f};
}

// ---- The math path's habits: upcast, FP32 products, mask per call, NaN-safe softmax.

std::vector<Finding> upcast_fp32(const RuleInput& in) {
  const TraceIndex& ix = in.index;
  // Where a conversion's copy_ recorded its dtypes (destination first, as
  // PyTorch's copy_(self, src) does), the outermost "to" it served and the
  // dtype it made: a "to" that makes no FP32 is no upcast.
  std::map<EventIndex, std::string> made;
  for (EventIndex c : ix.ops_named("copy_")) {
    if (!ix.is_conversion_copy(c) || ix.dtypes(c).empty()) continue;
    EventIndex owner = ix.copy_owner(c);
    while (is_op(ix, ix.parent(owner), "to")) owner = ix.parent(owner);
    made[owner] = std::string(first_dtype(ix.dtypes(c)));
  }
  // Inside attention (every upcast of a run) and outside it (a trace's model code).
  struct Group {
    Finding f;
    int upcasts = 0;
    std::string from;
    std::set<std::string> makers;  // the ops that called the outside ones
  };
  std::array<Group, 2> groups;
  for (EventIndex i : ix.ops_named("to")) {
    if (nested_in_same(ix, i)) continue;
    const auto dt = first_dtype(ix.dtypes(i));
    if (dt != "bf16" && dt != "fp16") continue;
    if (const auto m = made.find(i); m != made.end() && m->second != "fp32") continue;
    const bool outside = outside_attention(in, i);
    Group& g = groups[outside ? 1 : 0];
    ++g.upcasts;
    if (g.from.empty()) g.from = std::string(dt);
    if (outside) {
      const EventIndex caller = ix.enclosing_op(i, /*outermost=*/true);
      g.makers.insert(caller != kNone ? ix.at(caller).name : ix.at(i).name + " (top level)");
    }
    cite(g.f, ix, i);
  }
  std::vector<Finding> out;
  for (std::size_t k = 0; k < groups.size(); ++k) {
    Group& g = groups[k];
    if (g.upcasts == 0) continue;
    const double per_forward = static_cast<double>(g.upcasts) / in.steps;
    g.f.text = format("upcasts %.0f ", per_forward) + g.from + " tensors to FP32 " + per_call(ix);
    g.f.figures = {{"upcasts_per_forward", per_forward}};
    if (k == 1) {
      g.f.text += " outside attention, made by " + join({g.makers.begin(), g.makers.end()});
    } else {
      g.f.severity = Severity::Warning;
    }
    out.push_back(std::move(g.f));
  }
  return out;
}

// The GEMM kernels an op launched (itself or an op inside it).
bool launched_by(const TraceIndex& ix, EventIndex d, const std::set<EventIndex>& ops) {
  for (EventIndex op = ix.launching_op(d); op != kNone; op = ix.enclosing_op(op)) {
    if (ops.count(op)) return true;
  }
  return false;
}

std::vector<Finding> fp32_gemm(const RuleInput& in) {
  if (!in.dtype || !is_16bit(*in.dtype)) return {};
  const TraceIndex& ix = in.index;
  Finding f;
  std::set<EventIndex> fp32_ops;
  for (EventIndex i : ix.ops_named("matmul")) {
    if (nested_in_same(ix, i) || first_dtype(ix.dtypes(i)) != "fp32") continue;
    fp32_ops.insert(i);
    cite(f, ix, i);
  }
  if (fp32_ops.empty()) return {};
  // The FP32 kernels the products ran as: cuBLAS's sgemm family, or TF32 on
  // tensor cores; in a trace from elsewhere, only those these ops launched.
  std::set<std::string> sgemm;
  int fp32_kernels = 0, tf32_kernels = 0;
  for (EventIndex d : ix.device_activities()) {
    const Activity& a = ix.at(d);
    if (a.type != ActivityType::Kernel) continue;
    const GemmClass g = gemm_class(a.name);
    const bool fp32_named = a.name.find("sgemm") != std::string::npos ||
                            a.name.find("gemmSN_NN") != std::string::npos || a.name.find("_f32") != std::string::npos;
    if (!in.run.source.empty() && !launched_by(ix, d, fp32_ops)) continue;
    if (g == GemmClass::Tf32TensorCores) {
      ++tf32_kernels;
      cite(f, ix, d);
    } else if (g == GemmClass::Fp32CudaCores || (in.run.source.empty() && fp32_named)) {
      sgemm.insert(a.name.substr(0, 60));
      ++fp32_kernels;
      cite(f, ix, d);
    }
  }
  const std::string cores =
      tf32_kernels > 0 && fp32_kernels == 0 ? " (TF32 on tensor cores)" : " (CUDA cores, no tensor cores)";
  f.text = "FP32 GEMM on " + std::string(dtype_name(*in.dtype)) + " inputs" +
           (in.gpu && (fp32_kernels > 0 || tf32_kernels > 0) ? cores : std::string()) +
           (sgemm.empty() ? std::string() : ": " + *sgemm.begin());
  f.figures = {{"fp32_matmuls_per_forward", static_cast<double>(fp32_ops.size()) / in.steps}};
  if (in.gpu) {
    f.figures["fp32_kernels_per_forward"] = static_cast<double>(fp32_kernels) / in.steps;
    f.figures["tf32_kernels_per_forward"] = static_cast<double>(tf32_kernels) / in.steps;
  }
  return {f};
}

// GEMM kernels on CUDA cores where no op says why (a trace recorded without
// record_shapes has no input dtypes): the kernel names alone.
std::vector<Finding> gemm_cuda_cores(const RuleInput& in) {
  if (!in.gpu) return {};
  const TraceIndex& ix = in.index;
  for (EventIndex i : ix.ops_named("matmul")) {
    if (!ix.dtypes(i).empty()) return {};  // fp32-gemm reads the dtypes
  }
  Finding f;
  int cuda_cores = 0, tensor_cores = 0;
  std::string first;
  for (EventIndex d : ix.device_activities()) {
    if (ix.at(d).type != ActivityType::Kernel) continue;
    const GemmClass g = gemm_class(ix.at(d).name);
    if (g == GemmClass::TensorCores || g == GemmClass::Tf32TensorCores) ++tensor_cores;
    if (g != GemmClass::Fp32CudaCores) continue;
    if (first.empty()) first = ix.at(d).name.substr(0, 60);
    ++cuda_cores;
    cite(f, ix, d);
  }
  if (cuda_cores == 0) return {};
  f.text = format("FP32 GEMM kernels on CUDA cores, no tensor cores: %.0f ", cuda_cores / double(in.steps)) +
           per_call(ix) + " (" + first + "); the trace records no input dtypes to say why";
  f.figures = {{"cuda_core_gemms_per_forward", cuda_cores / double(in.steps)},
               {"tensor_core_gemms_per_forward", tensor_cores / double(in.steps)}};
  return {f};
}

std::vector<Finding> mask_rebuilt(const RuleInput& in) {
  const TraceIndex& ix = in.index;
  Finding f;
  std::vector<std::string> seen;
  for (const char* op : {"ones", "tril", "triu", "where"}) {
    const int n = per_forward(ix, op, in.steps);
    if (n == 0) continue;
    seen.emplace_back(op);
    f.figures[std::string(op) + "_per_forward"] = n;
    cite(f, ix, ix.ops_named(op).front());
  }
  if (seen.size() < 2) return {};
  f.text = "mask rebuilt on " + every_call(ix) + " (" + join(seen) + ")";
  return {f};
}

std::vector<Finding> nan_safe_softmax(const RuleInput& in) {
  const int n = per_forward(in.index, "_safe_softmax", in.steps);
  if (n == 0) return {};
  Finding f = found("NaN-safe softmax: a fully masked row gives zeros");
  cite(f, in.index, in.index.ops_named("_safe_softmax").front());
  f.figures = {{"calls_per_forward", n}};
  return {f};
}

// ---- Output health.

std::vector<Finding> nan_in_output(const RuleInput& in) {
  const auto& e = in.run.error;
  if (!e || e->nan_rows == 0) return {};
  Finding f = found(format("NaN in %.0f checked output rows", static_cast<double>(e->nan_rows)));
  if (e->nan_rows == e->nan_rows_fully_masked) f.text += " (fully masked rows: softmax over all -inf)";
  f.figures = {{"nan_rows", static_cast<double>(e->nan_rows)},
               {"nan_rows_fully_masked", static_cast<double>(e->nan_rows_fully_masked)},
               {"nan_count", static_cast<double>(e->nan_count)}};
  return {f};
}

// ---- Memory against the baseline's (the backend that materialises the scores).

std::vector<Finding> memory_below_baseline(const RuleInput& in) {
  const RunResult* base = memory_baseline(in.all);
  const Metrics& m = in.run.metrics;
  if (!base || in.run.traits.memory_baseline || m.peak_bytes <= 0) return {};
  const double ratio = static_cast<double>(base->metrics.peak_bytes) / static_cast<double>(m.peak_bytes);
  if (ratio < 4) return {};
  Finding f = found("peak memory " + mib(static_cast<double>(m.peak_bytes)) + format(", %.0fx below ", ratio) +
                    base->backend + "'s");
  f.figures = {{"peak_bytes", static_cast<double>(m.peak_bytes)},
               {"baseline_peak_bytes", static_cast<double>(base->metrics.peak_bytes)},
               {"ratio", ratio}};
  return {f};
}

std::vector<Finding> no_allocation(const RuleInput& in) {
  const RunResult* base = memory_baseline(in.all);
  if (!base || in.run.traits.memory_baseline || in.run.metrics.peak_bytes != 0 || in.gpu) return {};
  Finding f = found("no allocation inside forward (" + base->backend + " peaks at " +
                    mib(static_cast<double>(base->metrics.peak_bytes)) + ")");
  f.figures = {{"peak_bytes", 0}, {"baseline_peak_bytes", static_cast<double>(base->metrics.peak_bytes)}};
  return {f};
}

// The rule table: ids are stable (JSON and the HTML report key on them), the
// order is the order findings print in.
constexpr Rule kRules[] = {
    {"activities-not-counted", Severity::Warning, activities_not_counted},
    {"expectation-mismatch", Severity::Warning, expectation_mismatch},
    {"op-sequence-mismatch", Severity::Warning, op_sequence_mismatch},
    {"guess-confirmed", Severity::Info, guess_confirmed},
    {"guess-missed", Severity::Warning, guess_missed},
    // Warnings inside attention; information outside it, in a trace from elsewhere.
    {"hidden-copy", Severity::Info, hidden_copy},
    {"masked-fill-in-place", Severity::Info, masked_fill_in_place},
    {"fp8-quantization", Severity::Info, fp8_quantization},
    {"fp8-saturation", Severity::Warning, fp8_saturation},
    {"fp8-dequantize", Severity::Info, fp8_dequantize},
    {"upcast-fp32", Severity::Info, upcast_fp32},
    {"fp32-gemm", Severity::Warning, fp32_gemm},
    {"gemm-cuda-cores", Severity::Warning, gemm_cuda_cores},
    {"mask-rebuilt", Severity::Warning, mask_rebuilt},
    {"nan-safe-softmax", Severity::Info, nan_safe_softmax},
    {"nan-in-output", Severity::Error, nan_in_output},
    {"memory-below-baseline", Severity::Info, memory_below_baseline},
    {"no-allocation", Severity::Info, no_allocation},
    {"saved-for-backward", Severity::Info, saved_for_backward},
    {"backward-recompute", Severity::Info, backward_recompute},
    {"backward-over-forward", Severity::Info, backward_over_forward},
    {"backward-kernels", Severity::Info, backward_kernels},
    {"attention-problems", Severity::Info, attention_problems},
    {"one-fused-kernel", Severity::Info, one_fused_kernel},
    {"low-occupancy", Severity::Info, low_occupancy},
    {"launch-kernel-ex", Severity::Info, launch_kernel_ex},
    {"split-kv", Severity::Info, split_kv},
    {"cpu-bound", Severity::Warning, cpu_bound},
    {"launch-bound", Severity::Warning, launch_bound},
    {"bound", Severity::Info, bound},
    {"graph-attention-roof", Severity::Info, graph_attention_roof},
    {"packed-batch", Severity::Info, packed_batch},
    {"comm-overlap", Severity::Info, comm_overlap},
    {"rank-wait", Severity::Info, rank_wait},
    {"load-imbalance", Severity::Info, load_imbalance},
};

}  // namespace

std::span<const Rule> rule_table() { return kRules; }

}  // namespace attnprof::analysis
