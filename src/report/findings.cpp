#include "report/findings.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "report/format.h"
#include "report/metrics.h"

namespace attnprof::report {
namespace {

// The run the others' memory is read against (the backend that declares
// itself the memory baseline), when it ran.
const RunResult* memory_baseline(const std::vector<RunResult>& all) {
  for (const auto& r : all) {
    if (r.traits.memory_baseline && !r.failure && r.metrics.steps > 0) return &r;
  }
  return nullptr;
}

// Ops of the first recorded forward, as names.
std::vector<std::string> op_names(const Trace& t) {
  std::vector<std::string> names;
  const auto ops = forward_ops(t);
  if (!ops.empty()) {
    for (const Activity* a : ops.front()) names.push_back(a->name);
  }
  return names;
}

int count_ops(const Trace& t, std::string_view name, int steps) {
  int n = 0;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::CpuOp && a.name == name) ++n;
  }
  return steps > 0 ? n / steps : n;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Copies: where they came from (the op that launched or ran them) and their bytes.
void copy_rules(const RunResult& r, std::vector<std::string>& out) {
  const Trace& t = r.trace;
  const int steps = std::max(1, r.metrics.steps);
  if (r.problem.device == Device::Cuda) {
    std::map<std::string, std::pair<int, double>> by_op;
    for (const Activity* d : device_activities(t)) {
      if (d->type != ActivityType::Memcpy) continue;
      const Activity* op = launching_op(t, *d, /*outermost=*/true);
      const Activity* inner = launching_op(t, *d);
      std::string where = op ? op->name : std::string("(no op)");
      if (inner && inner != op) where += " (its " + inner->name + ")";
      auto& slot = by_op[where];
      slot.first += 1;
      slot.second += d->transfer ? static_cast<double>(d->transfer->bytes) : 0;
    }
    for (auto& [op, v] : by_op) {
      out.push_back("hidden copy: " + op + " makes " + format("%.0f", v.first / steps) +
                    " device-to-device copy per forward (" + mib(v.second / steps) + ")");
    }
    return;
  }
  // CPU: a copy_ op nested in another op, and the bytes allocated for it.
  std::map<std::string, std::pair<int, double>> by_parent;
  for (const auto& c : t.activities) {
    if (c.type != ActivityType::CpuOp || c.name != "copy_") continue;
    const Activity* parent = nullptr;
    for (const auto& a : t.activities) {
      if (a.type == ActivityType::CpuOp && a.depth == c.depth - 1 && a.tid == c.tid && a.start_ns <= c.start_ns &&
          a.end_ns() >= c.end_ns()) {
        parent = &a;
      }
    }
    double bytes = 0;
    if (parent) {
      for (const auto& a : t.activities) {
        if (a.allocation && a.allocation->bytes > 0 && a.start_ns >= parent->start_ns && a.start_ns <= c.end_ns()) {
          bytes += static_cast<double>(a.allocation->bytes);
        }
      }
    }
    auto& slot = by_parent[parent ? parent->name : std::string("(top level)")];
    slot.first += 1;
    slot.second += bytes;
  }
  for (auto& [op, v] : by_parent) {
    out.push_back("hidden copy: " + op + " (out of place) allocates and copies " + mib(v.second / steps) +
                  " per forward");
  }
}

}  // namespace

std::vector<std::string> findings(const RunResult& r, const std::vector<RunResult>& all, const Guesses& guesses) {
  std::vector<std::string> out;
  if (r.failure || r.metrics.steps == 0) return out;
  const Trace& t = r.trace;
  const Metrics& m = r.metrics;
  const Problem& p = r.problem;
  const int steps = std::max(1, m.steps);
  const bool gpu = p.device == Device::Cuda;

  // Guess first, then look: the backend's declared expectation and the user's.
  if (gpu && r.expectation.device_activities >= 0 && m.kernels_per_forward &&
      std::abs(*m.kernels_per_forward - r.expectation.device_activities) > 0.01) {
    std::string s = format("expected %.0f GPU activities per forward, ", r.expectation.device_activities) +
                    format("saw %.0f", *m.kernels_per_forward);
    // Name what the guess missed: memsets a library issued, and where from.
    std::map<std::string, int> memsets;
    for (const Activity* d : device_activities(t)) {
      if (d->type != ActivityType::Memset) continue;
      const Activity* op = launching_op(t, *d);
      ++memsets[op ? op->name : std::string("(no op)")];
    }
    for (const auto& [op, n] : memsets) {
      s += format(": +%.0f memset", static_cast<double>(n) / steps) + " launched inside " + op +
           " (the library zeroes a workspace)";
    }
    out.push_back(s);
  }
  const auto ops = op_names(t);
  if (!r.expectation.cpu_ops.empty() && ops != r.expectation.cpu_ops) {
    out.push_back("expected ops [" + join(r.expectation.cpu_ops) + "], saw [" + join(ops) + "]");
  }
  if (auto g = guesses.find(r.backend); g != guesses.end()) {
    const double seen = gpu ? m.kernels_per_forward.value_or(-1) : m.ops_per_forward;
    const char* what = gpu ? "GPU activities" : "ops";
    out.push_back(std::string(std::abs(seen - g->second) < 0.01 ? "guess confirmed: " : "guess missed: ") +
                  format("you expected %.0f ", g->second) + what + format(" per forward, the trace shows %.1f", seen));
  }

  copy_rules(r, out);
  if (m.copies_per_forward == 0 && std::find(ops.begin(), ops.end(), "masked_fill_") != ops.end()) {
    std::string s = "masked fill runs in place: no copy";
    if (const RunResult* naive = memory_baseline(all); naive && naive->metrics.allocated_bytes_per_forward > 0) {
      const double saved = naive->metrics.allocated_bytes_per_forward - m.allocated_bytes_per_forward;
      if (saved > 0) s += ", " + mib(saved) + " less allocated per forward than " + naive->backend;
      if (naive->metrics.device_time_us && m.device_time_us) {
        s += format(", %.2fx ", *m.device_time_us / *naive->metrics.device_time_us) + naive->backend + "'s time";
      }
    }
    out.push_back(s);
  }

  // The math path's habits: upcast, FP32 products, mask per call, NaN-safe softmax.
  int upcasts = 0;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::CpuOp && a.name == "to" && (a.input_dtypes == "bf16" || a.input_dtypes == "fp16")) {
      ++upcasts;
    }
  }
  if (upcasts > 0) {
    out.push_back(format("upcasts %.0f ", static_cast<double>(upcasts) / steps) + std::string(dtype_name(p.dtype)) +
                  " tensors to FP32 per forward");
  }
  if (is_16bit(p.dtype)) {
    int fp32_mm = 0;
    for (const auto& a : t.activities) {
      if (a.type == ActivityType::CpuOp && a.name == "matmul" && a.input_dtypes.rfind("fp32", 0) == 0) ++fp32_mm;
    }
    std::set<std::string> sgemm;
    for (const Activity* d : device_activities(t)) {
      if (d->type == ActivityType::Kernel &&
          (d->name.find("sgemm") != std::string::npos || d->name.find("gemmSN_NN") != std::string::npos ||
           d->name.find("_f32") != std::string::npos)) {
        sgemm.insert(d->name.substr(0, 60));
      }
    }
    if (fp32_mm > 0) {
      out.push_back("FP32 GEMM on " + std::string(dtype_name(p.dtype)) + " inputs" +
                    (gpu ? std::string(" (CUDA cores, no tensor cores)") : std::string()) +
                    (sgemm.empty() ? std::string() : ": " + *sgemm.begin()));
    }
  }
  const std::vector<std::string> rebuild = {"ones", "tril", "where"};
  std::vector<std::string> seen_rebuild;
  for (const auto& n : rebuild) {
    if (count_ops(t, n, steps) > 0) seen_rebuild.push_back(n);
  }
  if (seen_rebuild.size() >= 2) out.push_back("mask rebuilt on every call (" + join(seen_rebuild) + ")");
  if (count_ops(t, "_safe_softmax", steps) > 0) out.push_back("NaN-safe softmax: a fully masked row gives zeros");

  // Output health.
  if (r.error && r.error->nan_rows > 0) {
    std::string s = format("NaN in %.0f checked output rows", static_cast<double>(r.error->nan_rows));
    if (r.error->nan_rows == r.error->nan_rows_fully_masked) s += " (fully masked rows: softmax over all -inf)";
    out.push_back(s);
  }

  // Memory against naive's, at long sequences.
  if (const RunResult* naive = memory_baseline(all); naive && !r.traits.memory_baseline && m.peak_bytes > 0) {
    const double ratio = static_cast<double>(naive->metrics.peak_bytes) / static_cast<double>(m.peak_bytes);
    if (ratio >= 4)
      out.push_back("peak memory " + mib(static_cast<double>(m.peak_bytes)) + format(", %.0fx below ", ratio) + naive->backend + "'s");
  } else if (m.peak_bytes == 0 && !gpu && naive && !r.traits.memory_baseline) {
    out.push_back("no allocation inside forward (" + naive->backend + " peaks at " +
                  mib(static_cast<double>(naive->metrics.peak_bytes)) + ")");
  }

  if (gpu) {
    // One fused kernel, and heavy blocks at low occupancy.
    const auto dev = device_activities(t);
    if (m.kernels_per_forward && *m.kernels_per_forward == 1 && !dev.empty()) {
      out.push_back("one fused kernel: " + dev.front()->name.substr(0, 70));
    }
    const Activity* heavy = nullptr;
    for (const Activity* d : dev) {
      if (d->kernel && (!heavy || d->dur_ns > heavy->dur_ns)) heavy = d;
    }
    if (heavy && heavy->kernel && heavy->kernel->occupancy_pct && *heavy->kernel->occupancy_pct < 30) {
      const auto& k = *heavy->kernel;
      out.push_back(format("heavy blocks at low occupancy: %.0f%% ", *k.occupancy_pct) +
                    format("(%.0f registers/thread, ", k.registers_per_thread) +
                    format("%.0f KiB shared per block)", (k.static_shared_bytes + k.dynamic_shared_bytes) / 1024.0));
    }
    if (const Activity* call = heavy ? launch_call(t, *heavy) : nullptr;
        call && call->type == ActivityType::CudaDriver && call->name.rfind("cuLaunchKernelEx", 0) == 0 &&
        heavy->kernel && heavy->kernel->occupancy_pct) {
      out.push_back("main kernel launched through the driver's cuLaunchKernelEx; occupancy " +
                    format("%.0f%% computed from its record", *heavy->kernel->occupancy_pct));
    }
    // Judged on the unprofiled host time where there is one: API tracing
    // alone can make a short call look CPU-bound.
    const double host_us = m.host_time_unprofiled_us.value_or(m.host_time_us);
    if (m.device_time_us && host_us > 1.5 * *m.device_time_us) {
      out.push_back(format("CPU-bound: %.0f us of host time per call for ", host_us) +
                    format("%.0f us of GPU work", *m.device_time_us));
    }
  }
  return out;
}

void apply_acceptance(std::vector<RunResult>& results) {
  std::optional<double> math_rel;
  for (const auto& r : results) {
    if (r.traits.reference_precision && r.error && r.error->nan_rows == 0) math_rel = r.error->rel;
  }
  for (auto& r : results) {
    if (!r.error) continue;
    r.acceptance = accept(r.problem.dtype, *r.error, math_rel, r.traits.nan_on_fully_masked);
  }
}

}  // namespace attnprof::report
