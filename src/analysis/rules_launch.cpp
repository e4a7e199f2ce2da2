// The GPU's rules: the attention problems of a trace from elsewhere, one fused
// kernel, heavy blocks at low occupancy, the driver's extended launch, and
// calls bound by the CPU or by their launches.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "analysis/attention_calls.h"
#include "analysis/format.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {

using namespace rule_support;

// A trace from elsewhere: one finding per distinct attention problem (the
// backend, pass, shape, mask and dtype), with its kernels and TFLOP/s.
std::vector<Finding> attention_problems(const RuleInput& in) {
  if (in.attention == nullptr || in.attention->empty()) return {};
  struct Group {
    Finding f;
    int calls = 0;
    std::size_t kernels = 0;
    double flops = 0, us = 0;
    bool all_flops = true;
  };
  std::map<std::tuple<std::string, bool, std::string, std::string, std::string>, Group> groups;
  for (const AttentionCall& c : *in.attention) {
    Group& g = groups[{c.backend, c.backward, c.shape, c.mask, c.dtype}];
    ++g.calls;
    g.kernels += c.kernels.size();
    g.us += in.gpu ? c.gpu_us : c.cpu_us;
    g.all_flops &= c.flops.has_value();
    if (c.flops) g.flops += *c.flops;
    cite(g.f, in.index, static_cast<EventIndex>(c.event));
  }
  std::vector<Finding> out;
  for (auto& [key, g] : groups) {
    const auto& [backend, backward, shape, mask, dtype] = key;
    const double calls = static_cast<double>(g.calls) / in.steps;
    std::string text = "attention: " + format("%.0f ", calls) + backend + (backward ? " backward" : " forward") +
                       (calls == 1 ? " call " : " calls ") + per_call(in.index);
    std::string what;
    for (const auto& x : {shape, mask, dtype}) {
      if (x.empty()) continue;
      if (!what.empty()) what += ", ";
      what += x;
    }
    text += what.empty() ? " (shapes not recorded)" : " (" + what + ")";
    const double kernels = static_cast<double>(g.kernels) / g.calls;
    if (in.gpu) text += format(", %.0f kernel", kernels) + (kernels == 1 ? "" : "s") + " each";
    g.f.figures = {{"calls_per_forward", calls}, {"kernels_per_call", kernels}, {"time_us", g.us}};
    if (g.all_flops && g.us > 0) {
      const double tflops = g.flops / (g.us * 1e-6) / 1e12;
      text += format(", %.2f TFLOP/s", tflops);
      g.f.figures["tflops"] = tflops;
    }
    g.f.text = std::move(text);
    out.push_back(std::move(g.f));
  }
  return out;
}

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

// The GPU idle between device activities, per call: gaps between the merged
// busy intervals from the first activity's start to the last one's end.
std::vector<Finding> launch_bound(const RuleInput& in) {
  if (!in.gpu) return {};
  const TraceIndex& ix = in.index;
  double busy = 0, span = 0, host = 0, launches = 0;
  std::vector<double> gaps;
  for (std::size_t c = 0; c < ix.forwards().size(); ++c) {
    const auto dev = ix.forward_device(c);
    if (dev.size() < 3) continue;
    std::vector<std::pair<std::int64_t, std::int64_t>> iv;
    for (EventIndex d : dev) iv.emplace_back(ix.at(d).start_ns, ix.at(d).end_ns());
    std::sort(iv.begin(), iv.end());
    std::int64_t cur_s = iv.front().first, cur_e = iv.front().second;
    for (const auto& [s, e] : iv) {
      if (s > cur_e) {
        busy += static_cast<double>(cur_e - cur_s);
        gaps.push_back(static_cast<double>(s - cur_e));
        cur_s = s;
      }
      cur_e = std::max(cur_e, e);
    }
    busy += static_cast<double>(cur_e - cur_s);
    span += static_cast<double>(cur_e - iv.front().first);
    host += static_cast<double>(ix.call_end_ns(c) - ix.call_start_ns(c));
    launches += static_cast<double>(dev.size());
  }
  if (span <= 0 || gaps.empty()) return {};
  const double idle = 1.0 - busy / span;
  if (idle < 0.5) return {};
  std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
  const double median_gap_us = gaps[gaps.size() / 2] / 1e3;
  const double host_per_launch_us = host / launches / 1e3;
  Finding f = found(format("launch-bound: the GPU idles %.0f%% of the time between its first and last ", idle * 100) +
                    format("activity (%.0f ", launches / in.steps) + per_call(ix) +
                    format(", median gap %.1f us); ", median_gap_us) +
                    format("%.1f us of host time per launch", host_per_launch_us));
  cite_first_forward(f, ix);
  f.figures = {{"gpu_idle_pct", idle * 100},
               {"device_activities_per_forward", launches / in.steps},
               {"median_gap_us", median_gap_us},
               {"host_us_per_launch", host_per_launch_us}};
  return {f};
}

}  // namespace attnprof::analysis
