// Per-call figures read off a recorded trace: counts, times, memory, and
// the roofline's two sides (TFLOP/s and GB/s against the measured ceilings).
#include "analysis/metrics.h"

#include <algorithm>

namespace attnprof::analysis {
namespace {

// Total time covered by a set of intervals (overlaps counted once).
double union_ns(std::vector<std::pair<std::int64_t, std::int64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0;
  std::int64_t cur_s = 0, cur_e = -1;
  for (auto [s, e] : iv) {
    if (s > cur_e) {
      if (cur_e >= cur_s) total += static_cast<double>(cur_e - cur_s);
      cur_s = s;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e >= cur_s) total += static_cast<double>(cur_e - cur_s);
  return total;
}

}  // namespace

Metrics measure(const Trace& t, const Problem& p, double ceiling_tflops, double copy_gbs) {
  return measure(TraceIndex(t), p, ceiling_tflops, copy_gbs);
}

Metrics measure(const TraceIndex& index, const Problem& p, double ceiling_tflops, double copy_gbs) {
  MetricSums sums;
  add_to(sums, index, p);
  return finish(sums, p, ceiling_tflops, copy_gbs);
}

void add_to(MetricSums& s, const TraceIndex& index, const Problem& p) {
  const Trace& t = index.trace();
  s.world_size = std::max(s.world_size, t.world_size);
  const auto fw = index.forwards();
  if (fw.empty()) return;
  s.forwards += static_cast<std::int64_t>(fw.size());

  for (std::size_t f = 0; f < fw.size(); ++f) {
    s.host_ns += static_cast<double>(index.call_end_ns(f) - index.call_start_ns(f));
    s.ops += static_cast<double>(index.forward_ops(f).size());
  }

  const auto dev = index.device_activities();
  if (p.device == Device::Cuda) {
    std::vector<std::pair<std::int64_t, std::int64_t>> iv;
    iv.reserve(dev.size());
    for (EventIndex i : dev) {
      const Activity& a = index.at(i);
      iv.emplace_back(a.start_ns, a.end_ns());
      if (a.type == ActivityType::Memcpy) s.copies += 1;
      if (a.type == ActivityType::Memset) s.memsets += 1;
      if (a.type == ActivityType::Kernel) {
        MetricSums::KernelTime& k = s.kernels[a.name];
        k.ns += static_cast<double>(a.dur_ns);
        // The kernel's latest record speaks for it (its launch shape).
        k.occupancy_pct = a.kernel ? a.kernel->occupancy_pct : std::nullopt;
      }
    }
    s.device_activities += static_cast<double>(dev.size());
    // The folded traces are steps the runner synchronized between, so their
    // device spans never overlap and the unions add up.
    s.device_union_ns += union_ns(std::move(iv));
    if (t.world_size > 1) {
      std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> by_device;
      for (int d = 0; d < t.world_size; ++d) by_device[d];
      for (EventIndex i : dev) {
        const Activity& a = index.at(i);
        if (auto it = by_device.find(a.device); it != by_device.end()) it->second.emplace_back(a.start_ns, a.end_ns());
      }
      if (s.rank_union_ns.size() < static_cast<std::size_t>(t.world_size)) s.rank_union_ns.resize(t.world_size, 0.0);
      for (auto& [d, v] : by_device) s.rank_union_ns[static_cast<std::size_t>(d)] += union_ns(std::move(v));
    }
    if (dev.empty()) {
      // No device activities recorded. With CUPTI off the fallback times a
      // span per forward with device events and counts nothing: the count
      // stays unknown rather than reading as 0 kernels.
      for (const auto& a : t.activities) {
        if (a.type == ActivityType::GpuUserAnnotation) {
          s.gpu_annotation_ns += static_cast<double>(a.dur_ns);
          s.gpu_annotations += 1;
        }
      }
    }
  } else {
    // Copies nested inside other ops (masked_fill's) count too; a dtype
    // conversion's does not (the upcast rule counts those).
    for (EventIndex c : index.ops_named("copy_")) s.copies += index.is_conversion_copy(c) ? 0 : 1;
  }

  // Memory: the running total's peak inside each forward, above its start.
  for (std::size_t f = 0; f < fw.size(); ++f) {
    std::int64_t start_total = -1, top = 0;
    for (EventIndex i : index.allocations_between(index.call_start_ns(f), index.call_end_ns(f))) {
      const auto& al = *index.at(i).allocation;
      if (start_total < 0) start_total = al.total_allocated - al.bytes;
      top = std::max(top, al.total_allocated - start_total);
      if (al.bytes > 0) s.allocated += static_cast<double>(al.bytes);
    }
    s.peak_bytes = std::max(s.peak_bytes, top);
  }
}

Metrics finish(const MetricSums& s, const Problem& p, double ceiling_tflops, double copy_gbs) {
  Metrics m;
  if (ceiling_tflops > 0) m.ceiling_tflops = ceiling_tflops;
  if (copy_gbs > 0) m.copy_ceiling_gbs = copy_gbs;
  m.steps = static_cast<int>(s.forwards);
  if (s.forwards == 0) return m;
  const double steps = static_cast<double>(s.forwards);
  m.host_time_us = s.host_ns / steps / 1e3;
  m.ops_per_forward = s.ops / steps;

  if (p.device == Device::Cuda) {
    m.memsets_per_forward = s.memsets / steps;
    if (s.device_activities > 0) {
      m.kernels_per_forward = s.device_activities / steps;
      m.device_time_us = s.device_union_ns / steps / 1e3;
      if (s.world_size > 1) {
        m.world_size = s.world_size;
        for (double ns : s.rank_union_ns) m.device_time_per_rank_us.push_back(ns / steps / 1e3);
      }
    } else if (s.gpu_annotations > 0) {
      m.device_time_us = s.gpu_annotation_ns / s.gpu_annotations / 1e3;
    } else {
      m.kernels_per_forward = 0;
    }
    // The occupancy of the kernel with the most device time (the first such
    // name, as the map orders them, on a tie).
    const MetricSums::KernelTime* heaviest = nullptr;
    for (const auto& [name, k] : s.kernels) {
      if (!heaviest || k.ns > heaviest->ns) heaviest = &k;
    }
    if (heaviest) m.occupancy_pct = heaviest->occupancy_pct;
  } else {
    m.device_time_us = m.host_time_us;
  }
  m.copies_per_forward = s.copies / steps;
  m.peak_bytes = s.peak_bytes;
  m.allocated_bytes_per_forward = s.allocated / steps;

  if (m.device_time_us && *m.device_time_us > 0) {
    const double seconds = *m.device_time_us * 1e-6;
    const double gpus = std::max(1, s.world_size);
    m.tflops = p.flops() / seconds / 1e12;
    m.gbs = static_cast<double>(p.io_bytes()) / seconds / 1e9;
    // Against the ceilings of every GPU the call ran on (ring attention's --gpus N).
    if (ceiling_tflops > 0) m.ceiling_pct = *m.tflops / (ceiling_tflops * gpus) * 100.0;
    if (copy_gbs > 0) m.copy_ceiling_pct = *m.gbs / (copy_gbs * gpus) * 100.0;
  }
  return m;
}

}  // namespace attnprof::analysis
