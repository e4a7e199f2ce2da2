// The rules, each one function that reads the trace the way the reference
// study read its traces, and the one table that lists them. Rules read the
// index's normalised names and the backend's Traits, never backend names.
#include "analysis/rules.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "analysis/format.h"
#include "analysis/normalize.h"

namespace attnprof::analysis {
namespace {

// Evidence is for pointing at events, not listing a million of them; the
// figures carry the counts.
constexpr std::size_t kMaxEvidence = 16;

void cite(Finding& f, const TraceIndex& ix, EventIndex i) {
  if (i != kNone && f.evidence.size() < kMaxEvidence) f.evidence.push_back(ix.ref(i));
}

Finding found(std::string text) {
  Finding f;
  f.text = std::move(text);
  return f;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool is_op(const TraceIndex& ix, EventIndex i, std::string_view name) {
  return i != kNone && ix.at(i).type == ActivityType::CpuOp && ix.op(i) == name;
}

// An op called by another op of the same name (aten::matmul calling aten::bmm,
// aten::to calling aten::_to_copy) is one call, counted at the outer one.
bool nested_in_same(const TraceIndex& ix, EventIndex i) { return is_op(ix, ix.parent(i), ix.op(i)); }

// Calls per forward of an op (whole calls: a mask built every other forward is not per call).
int per_forward(const TraceIndex& ix, std::string_view op, int steps) {
  return static_cast<int>(ix.ops_named(op).size()) / steps;
}

// The ops the first recorded forward called directly.
std::span<const EventIndex> first_forward_ops(const TraceIndex& ix) {
  return ix.forwards().empty() ? std::span<const EventIndex>() : ix.forward_ops(0);
}

std::vector<std::string> op_names(const TraceIndex& ix) {
  std::vector<std::string> names;
  for (EventIndex i : first_forward_ops(ix)) names.emplace_back(ix.op(i));
  return names;
}

void cite_first_forward(Finding& f, const TraceIndex& ix) {
  if (!ix.forwards().empty()) cite(f, ix, ix.forwards().front());
}

// The run the others' memory is read against (the backend that declares
// itself the memory baseline), when it ran.
const RunResult* memory_baseline(const std::vector<RunResult>& all) {
  for (const auto& r : all) {
    if (r.traits.memory_baseline && !r.failure && r.metrics.steps > 0) return &r;
  }
  return nullptr;
}

// The longest kernel with a record of its launch configuration.
EventIndex heaviest_kernel(const TraceIndex& ix) {
  EventIndex heavy = kNone;
  for (EventIndex d : ix.device_activities()) {
    if (ix.at(d).kernel && (heavy == kNone || ix.at(d).dur_ns > ix.at(heavy).dur_ns)) heavy = d;
  }
  return heavy;
}

// ---- Guess first, then look: the backend's declared expectation and the user's.

std::vector<Finding> expectation_mismatch(const RuleInput& in) {
  const RunResult& r = in.run;
  const Metrics& m = r.metrics;
  if (!in.gpu || r.expectation.device_activities < 0 || !m.kernels_per_forward ||
      std::abs(*m.kernels_per_forward - r.expectation.device_activities) <= 0.01) {
    return {};
  }
  const TraceIndex& ix = in.index;
  Finding f = found(format("expected %.0f GPU activities per forward, ", r.expectation.device_activities) +
                    format("saw %.0f", *m.kernels_per_forward));
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
            what + format(" per forward, the trace shows %.1f", seen));
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
                    "; the expected count and any --expect guess are not checked");
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
};

std::vector<Finding> copy_findings(const RuleInput& in, const std::map<std::string, CopyGroup>& groups, bool device) {
  std::vector<Finding> out;
  for (const auto& [op, g] : groups) {
    const double bytes = g.bytes / in.steps;
    Finding f =
        found(device ? "hidden copy: " + op + " makes " + format("%.0f", g.copies / in.steps) +
                           " device-to-device copy per forward (" + mib(bytes) + ")"
                     : "hidden copy: " + op + " (out of place) allocates and copies " + mib(bytes) + " per forward");
    for (EventIndex i : g.events) cite(f, in.index, i);
    f.figures = {{"copies_per_forward", g.copies / in.steps}, {"bytes_per_forward", bytes}};
    out.push_back(std::move(f));
  }
  return out;
}

// GPU: each memcpy attributed to the op the forward called (and the op inside
// it that launched the copy).
std::vector<Finding> hidden_copy_device(const RuleInput& in) {
  const TraceIndex& ix = in.index;
  std::map<std::string, CopyGroup> by_op;
  for (EventIndex d : ix.device_activities()) {
    const Activity& a = ix.at(d);
    if (a.type != ActivityType::Memcpy) continue;
    const EventIndex outer = ix.launching_op(d, /*outermost=*/true);
    const EventIndex inner = ix.launching_op(d);
    std::string where = outer != kNone ? std::string(ix.op(outer)) : std::string("(no op)");
    if (inner != kNone && inner != outer) where += " (its " + std::string(ix.op(inner)) + ")";
    auto& g = by_op[where];
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
  std::map<std::string, CopyGroup> by_parent;
  for (EventIndex c : ix.ops_named("copy_")) {
    if (ix.is_conversion_copy(c)) continue;
    const EventIndex parent = ix.copy_owner(c);
    auto& g = by_parent[parent != kNone ? std::string(ix.op(parent)) : std::string("(top level)")];
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
      f.text += ", " + mib(saved) + " less allocated per forward than " + base->backend;
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
  Finding f;
  int upcasts = 0;
  for (EventIndex i : ix.ops_named("to")) {
    if (nested_in_same(ix, i)) continue;
    const auto dt = first_dtype(ix.dtypes(i));
    if (dt == "bf16" || dt == "fp16") {
      ++upcasts;
      cite(f, ix, i);
    }
  }
  if (upcasts == 0) return {};
  const double per_forward = static_cast<double>(upcasts) / in.steps;
  f.text = format("upcasts %.0f ", per_forward) + std::string(dtype_name(in.run.problem.dtype)) +
           " tensors to FP32 per forward";
  f.figures = {{"upcasts_per_forward", per_forward}};
  return {f};
}

std::vector<Finding> fp32_gemm(const RuleInput& in) {
  const Problem& p = in.run.problem;
  if (!is_16bit(p.dtype)) return {};
  const TraceIndex& ix = in.index;
  Finding f;
  int fp32_mm = 0;
  for (EventIndex i : ix.ops_named("matmul")) {
    if (nested_in_same(ix, i) || first_dtype(ix.dtypes(i)) != "fp32") continue;
    ++fp32_mm;
    cite(f, ix, i);
  }
  if (fp32_mm == 0) return {};
  // The FP32 kernels the products ran as: cuBLAS's sgemm family.
  std::set<std::string> sgemm;
  int fp32_kernels = 0;
  for (EventIndex d : ix.device_activities()) {
    const Activity& a = ix.at(d);
    if (a.type == ActivityType::Kernel &&
        (a.name.find("sgemm") != std::string::npos || a.name.find("gemmSN_NN") != std::string::npos ||
         a.name.find("_f32") != std::string::npos)) {
      sgemm.insert(a.name.substr(0, 60));
      ++fp32_kernels;
      cite(f, ix, d);
    }
  }
  f.text = "FP32 GEMM on " + std::string(dtype_name(p.dtype)) + " inputs" +
           (in.gpu ? std::string(" (CUDA cores, no tensor cores)") : std::string()) +
           (sgemm.empty() ? std::string() : ": " + *sgemm.begin());
  f.figures = {{"fp32_matmuls_per_forward", static_cast<double>(fp32_mm) / in.steps}};
  if (in.gpu) f.figures["fp32_kernels_per_forward"] = static_cast<double>(fp32_kernels) / in.steps;
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
  f.text = "mask rebuilt on every call (" + join(seen) + ")";
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

// ---- GPU: one fused kernel, heavy blocks at low occupancy, how it was launched, CPU-bound.

std::vector<Finding> one_fused_kernel(const RuleInput& in) {
  const auto dev = in.index.device_activities();
  const auto& k = in.run.metrics.kernels_per_forward;
  if (!in.gpu || !k || *k != 1 || dev.empty()) return {};
  Finding f = found("one fused kernel: " + in.index.at(dev.front()).name.substr(0, 70));
  cite(f, in.index, dev.front());
  return {f};
}

std::vector<Finding> low_occupancy(const RuleInput& in) {
  if (!in.gpu) return {};
  const EventIndex heavy = heaviest_kernel(in.index);
  if (heavy == kNone) return {};
  const KernelInfo& k = *in.index.at(heavy).kernel;
  if (!k.occupancy_pct || *k.occupancy_pct >= 30) return {};
  const double shared = k.static_shared_bytes + k.dynamic_shared_bytes;
  Finding f = found(format("heavy blocks at low occupancy: %.0f%% ", *k.occupancy_pct) +
                    format("(%.0f registers/thread, ", k.registers_per_thread) +
                    format("%.0f KiB shared per block)", shared / 1024.0));
  cite(f, in.index, heavy);
  f.figures = {{"occupancy_pct", *k.occupancy_pct},
               {"registers_per_thread", k.registers_per_thread},
               {"shared_bytes_per_block", shared}};
  return {f};
}

std::vector<Finding> launch_kernel_ex(const RuleInput& in) {
  if (!in.gpu) return {};
  const TraceIndex& ix = in.index;
  const EventIndex heavy = heaviest_kernel(ix);
  if (heavy == kNone || !ix.at(heavy).kernel->occupancy_pct) return {};
  const EventIndex call = ix.launch_call(heavy);
  if (call == kNone || ix.at(call).type != ActivityType::CudaDriver ||
      !ix.at(call).name.starts_with("cuLaunchKernelEx")) {
    return {};
  }
  const double occupancy = *ix.at(heavy).kernel->occupancy_pct;
  Finding f = found("main kernel launched through the driver's cuLaunchKernelEx; occupancy " +
                    format("%.0f%% computed from its record", occupancy));
  cite(f, ix, call);
  cite(f, ix, heavy);
  f.figures = {{"occupancy_pct", occupancy}};
  return {f};
}

// Judged on the unprofiled host time where there is one: API tracing alone
// can make a short call look CPU-bound.
std::vector<Finding> cpu_bound(const RuleInput& in) {
  const Metrics& m = in.run.metrics;
  const double host_us = m.host_time_unprofiled_us.value_or(m.host_time_us);
  if (!in.gpu || !m.device_time_us || host_us <= 1.5 * *m.device_time_us) return {};
  Finding f = found(format("CPU-bound: %.0f us of host time per call for ", host_us) +
                    format("%.0f us of GPU work", *m.device_time_us));
  cite_first_forward(f, in.index);
  f.figures = {{"host_us", host_us}, {"device_us", *m.device_time_us}};
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
    {"hidden-copy", Severity::Warning, hidden_copy},
    {"masked-fill-in-place", Severity::Info, masked_fill_in_place},
    {"upcast-fp32", Severity::Warning, upcast_fp32},
    {"fp32-gemm", Severity::Warning, fp32_gemm},
    {"mask-rebuilt", Severity::Warning, mask_rebuilt},
    {"nan-safe-softmax", Severity::Info, nan_safe_softmax},
    {"nan-in-output", Severity::Error, nan_in_output},
    {"memory-below-baseline", Severity::Info, memory_below_baseline},
    {"no-allocation", Severity::Info, no_allocation},
    {"one-fused-kernel", Severity::Info, one_fused_kernel},
    {"low-occupancy", Severity::Info, low_occupancy},
    {"launch-kernel-ex", Severity::Info, launch_kernel_ex},
    {"cpu-bound", Severity::Warning, cpu_bound},
};

}  // namespace

std::span<const Rule> rule_table() { return kRules; }

}  // namespace attnprof::analysis
