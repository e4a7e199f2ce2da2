// Attention calls in a trace (attention_calls.h): each attention op's outermost
// attention ancestor is one call; its dispatch, shapes and label are read from
// its ops (attention_op_args.cpp), the device activities it launched are
// attributed to it, and its time, FLOPs, bytes and shares are summed.
#include "analysis/attention_calls.h"

#include <algorithm>
#include <unordered_map>

#include "analysis/attention_op_args.h"
#include "analysis/format.h"
#include "analysis/graph_replays.h"
#include "analysis/kernel_names.h"
#include "attnprof/error.h"

namespace attnprof::analysis {

// The op-record readers (attention_op_args.h) by their short names, as when they were this file's own.
using namespace op_args;

bool is_attention_op(std::string_view n) {
  if (n.starts_with("aten::")) return has(n, "attention");
  if (n.starts_with("flash_attn::") || n.starts_with("attnprof::attention")) return true;
  if (has(n, "flex_attention")) return true;
  // Autograd's nodes: ScaledDotProductFlashAttentionBackward0, FlashAttnFuncBackward, and their
  // "autograd::engine::evaluate_function: ..." wrappers.
  return (has(n, "Attention") || has(n, "AttnFunc")) && has(n, "Backward");
}

bool is_compile_range(std::string_view n) {
  return n == "entire_frame_compile" || (has(n, "compile_inner") && has(n, "dynamo_timed"));
}

int attention_call_of(const TraceIndex& ix, const std::vector<AttentionCall>& calls, EventIndex i) {
  if (calls.empty() || i == kNone) return -1;
  if (const Activity& a = ix.at(i); a.on_device() && a.graph_id != 0) {
    for (std::size_t k = 0; k < calls.size(); ++k) {
      const auto& nodes = calls[k].graph_nodes;
      if (calls[k].graph_id == a.graph_id && std::binary_search(nodes.begin(), nodes.end(), a.graph_node_id)) {
        return static_cast<int>(k);
      }
    }
    return -1;
  }
  if (ix.at(i).on_device()) i = ix.launch_call(i);
  for (EventIndex e = i; e != kNone; e = ix.parent(e)) {
    const auto it = std::lower_bound(calls.begin(), calls.end(), static_cast<std::int64_t>(e),
                                     [](const AttentionCall& c, std::int64_t x) { return c.event < x; });
    if (it != calls.end() && it->event == e) return static_cast<int>(it - calls.begin());
  }
  return -1;
}

AttentionSummary attention_calls(const TraceIndex& ix, bool gpu, std::optional<double> ceiling_tflops,
                                 const Graph* graph, std::optional<double> memory_gbs) {
  AttentionSummary out;
  const auto n = static_cast<EventIndex>(ix.trace().activities.size());
  // Each attention op's outermost attention ancestor is its call.
  std::vector<EventIndex> roots;
  std::unordered_map<EventIndex, std::vector<EventIndex>> members;  // root -> its attention ops, root first
  for (EventIndex i = 0; i < n; ++i) {
    const Activity& a = ix.at(i);
    if (a.type != ActivityType::CpuOp || !is_attention_op(a.name)) continue;
    EventIndex root = i;
    bool compiling = false;
    for (EventIndex e = ix.parent(i); e != kNone; e = ix.parent(e)) {
      if (ix.at(e).type == ActivityType::CpuOp && is_attention_op(ix.at(e).name)) root = e;
      compiling |= is_compile_range(ix.at(e).name);
    }
    if (compiling) continue;  // traced on fake tensors while torch.compile compiled: no call ran
    if (root == i) roots.push_back(i);
    members[root].push_back(i);
  }
  std::sort(roots.begin(), roots.end());
  bool shapes_missing = false;
  for (EventIndex r : roots) {
    AttentionCall call;
    const Activity& a = ix.at(r);
    call.op = a.name;
    call.event = r;
    call.cpu_us = static_cast<double>(a.dur_ns) / 1e3;
    auto& ops = members[r];
    std::sort(ops.begin(), ops.end());  // the root first: it starts first, and comes first in trace order
    call.backward = is_backward_op(a.name);
    // The dispatch: the first op that names a backend, aten's own op before an autograd node.
    for (const bool aten_only : {true, false}) {
      for (EventIndex i : ops) {
        if (aten_only && !ix.at(i).name.starts_with("aten::")) continue;
        if (auto b = backend_of_op(ix.at(i).name); !b.empty()) {
          call.backend = std::move(b);
          call.dispatch = ix.at(i).name;
          break;
        }
      }
      if (!call.backend.empty()) break;
    }
    bool shaped = false;
    for (EventIndex i : ops) {
      const Signature* sig = signature_of(ix.at(i).name);
      if (!sig) continue;
      call.backward |= sig->backward;
      if (read_shapes(ix.at(i), *sig, call)) {
        shaped = true;
        break;
      }
    }
    if (call.backend == "attnprof") {
      // attnprof's ops name their backend in their second string argument.
      const Signature* sig = signature_of(a.name);
      const auto& c = a.concrete_inputs;
      const int at_i = sig ? (sig->backward ? 6 : 3) : -1;
      // Where torch kept no strings, the op's own label says them: opened
      // inside the op that ran, which a compiled graph's warm-up nests under
      // the same op again (through a dispatch mode); the outermost label wins.
      std::optional<AttnprofLabel> label;
      for (EventIndex i : ops) {
        if ((label = attnprof_label(ix, i))) break;
      }
      if (at_i >= 0 && static_cast<std::size_t>(at_i) < c.size() && !c[static_cast<std::size_t>(at_i)].empty()) {
        call.backend += ":" + c[static_cast<std::size_t>(at_i)];
      } else if (label && !label->backend.empty()) {
        call.backend += ":" + label->backend;
      }
      if (label) apply_label_mask(*label, call);
    }
    // SDPA's entry point leaves scale None (1/sqrt(D)); its dispatch op records the value used.
    for (EventIndex i : ops) {
      if (call.scale) break;
      const Signature* sig = signature_of(ix.at(i).name);
      if (sig) call.scale = number(at(ix.at(i).concrete_inputs, sig->scale));
    }
    if (call.problem && call.scale) call.problem->scale = call.scale;
    if (call.problem) {
      try {
        call.problem->validate();
      } catch (const Error& e) {
        call.refused = e.what();
      }
    }
    shapes_missing |= !shaped;
    if (call.problem) call.problem->device = gpu ? Device::Cuda : Device::Cpu;
    out.calls.push_back(std::move(call));
  }

  if (graph != nullptr) {
    // A replay: no op above its kernels; its calls come from the tie (or the
    // kernels' names), each `event` its first device activity. Host calls
    // (none launch a replay's work) and these stay sorted by event for
    // attention_call_of.
    for (AttentionCall& c : replay_calls(ix, *graph)) {
      if (c.problem) c.problem->device = Device::Cuda;
      out.calls.push_back(std::move(c));
    }
    std::stable_sort(out.calls.begin(), out.calls.end(),
                     [](const AttentionCall& x, const AttentionCall& y) { return x.event < y.event; });
  }
  // Device activities: each to the call that launched it.
  double kernel_us = 0;
  for (EventIndex d : ix.device_activities()) {
    const Activity& k = ix.at(d);
    if (k.type != ActivityType::Kernel) continue;
    const double us = static_cast<double>(k.dur_ns) / 1e3;
    kernel_us += us;
    const int c = attention_call_of(ix, out.calls, d);
    if (c < 0) continue;
    auto& call = out.calls[static_cast<std::size_t>(c)];
    call.kernels.push_back(k.name);
    call.gpu_us += us;
  }
  // The step's host span (a CPU trace's shares divide it).
  std::int64_t first = 0, last = 0;
  bool any = false;
  for (const auto& a : ix.trace().activities) {
    if (a.on_device() || a.type == ActivityType::Allocation) continue;
    first = any ? std::min(first, a.start_ns) : a.start_ns;
    last = any ? std::max(last, a.end_ns()) : a.end_ns();
    any = true;
  }
  out.total_us = gpu ? kernel_us : static_cast<double>(last - first) / 1e3;
  for (auto& call : out.calls) {
    if (call.backend.empty()) {
      for (const auto& k : call.kernels) {
        call.backend = attention_backend_of_kernel(k);
        if (!call.backend.empty()) break;
      }
    }
    if (call.backend.empty()) call.backend = "unknown";
    const double us = gpu ? call.gpu_us : call.cpu_us;
    (call.backward ? out.backward_us : out.forward_us) += us;
    if (call.flops && us > 0) call.tflops = *call.flops / (us * 1e-6) / 1e12;
    if (call.tflops && ceiling_tflops && *ceiling_tflops > 0) call.ceiling_pct = 100.0 * *call.tflops / *ceiling_tflops;
    // Bytes where FLOPs are counted (the same shapes, validated or cheap to count).
    if (call.flops && call.problem) call.bytes = static_cast<double>(call.problem->io_bytes());
    if (call.bytes && us > 0) call.gbs = *call.bytes / (us * 1e-6) / 1e9;
    if (call.gbs && memory_gbs && *memory_gbs > 0) call.bandwidth_pct = 100.0 * *call.gbs / *memory_gbs;
    if (out.total_us > 0) call.share_pct = 100.0 * us / out.total_us;
  }
  if (out.total_us > 0 && !out.calls.empty()) {
    out.forward_pct = 100.0 * out.forward_us / out.total_us;
    out.backward_pct = 100.0 * out.backward_us / out.total_us;
  }
  if (shapes_missing) {
    out.missing_shapes =
        "attention calls without shapes: record them with torch.profiler.profile(record_shapes=True) for FLOPs and "
        "TFLOP/s";
  }
  return out;
}

}  // namespace attnprof::analysis
