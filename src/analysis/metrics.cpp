// Per-call figures read off a recorded trace: counts, times, memory, and
// the roofline's two sides (TFLOP/s and GB/s against the measured ceilings).
#include "analysis/metrics.h"

#include <algorithm>
#include <map>
#include <string_view>

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
  Metrics m;
  if (ceiling_tflops > 0) m.ceiling_tflops = ceiling_tflops;
  if (copy_gbs > 0) m.copy_ceiling_gbs = copy_gbs;
  const Trace& t = index.trace();
  const auto fw = index.forwards();
  m.steps = static_cast<int>(fw.size());
  if (fw.empty()) return m;
  const double steps = static_cast<double>(fw.size());

  double host_ns = 0;
  for (std::size_t f = 0; f < fw.size(); ++f) {
    host_ns += static_cast<double>(index.call_end_ns(f) - index.call_start_ns(f));
  }
  m.host_time_us = host_ns / steps / 1e3;

  double op_count = 0;
  for (std::size_t f = 0; f < fw.size(); ++f) op_count += static_cast<double>(index.forward_ops(f).size());
  m.ops_per_forward = op_count / steps;

  const auto dev = index.device_activities();
  double copies = 0;
  if (p.device == Device::Cuda) {
    std::vector<std::pair<std::int64_t, std::int64_t>> iv;
    iv.reserve(dev.size());
    std::map<std::string_view, std::pair<double, EventIndex>> by_kernel;
    for (EventIndex i : dev) {
      const Activity& a = index.at(i);
      iv.emplace_back(a.start_ns, a.end_ns());
      if (a.type == ActivityType::Memcpy) copies += 1;
      if (a.type == ActivityType::Memset) m.memsets_per_forward += 1;
      if (a.type == ActivityType::Kernel) {
        auto& slot = by_kernel[a.name];
        slot.first += static_cast<double>(a.dur_ns);
        slot.second = i;
      }
    }
    m.memsets_per_forward /= steps;
    if (!dev.empty()) {
      m.kernels_per_forward = static_cast<double>(dev.size()) / steps;
      m.device_time_us = union_ns(std::move(iv)) / steps / 1e3;
      if (t.world_size > 1) {
        m.world_size = t.world_size;
        std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> by_device;
        for (int d = 0; d < t.world_size; ++d) by_device[d];
        for (EventIndex i : dev) {
          const Activity& a = index.at(i);
          if (auto it = by_device.find(a.device); it != by_device.end())
            it->second.emplace_back(a.start_ns, a.end_ns());
        }
        for (auto& [d, v] : by_device) m.device_time_per_rank_us.push_back(union_ns(std::move(v)) / steps / 1e3);
      }
    } else {
      // No device activities recorded. With CUPTI off the fallback times a
      // span per forward with device events and counts nothing: the count
      // stays unknown rather than reading as 0 kernels.
      double ns = 0;
      int n = 0;
      for (const auto& a : t.activities) {
        if (a.type == ActivityType::GpuUserAnnotation) {
          ns += static_cast<double>(a.dur_ns);
          ++n;
        }
      }
      if (n) {
        m.device_time_us = ns / n / 1e3;
      } else {
        m.kernels_per_forward = 0;
      }
    }
    EventIndex heaviest = kNone;
    double heaviest_ns = -1;
    for (auto& [name, v] : by_kernel) {
      if (v.first > heaviest_ns) {
        heaviest_ns = v.first;
        heaviest = v.second;
      }
    }
    if (heaviest != kNone && index.at(heaviest).kernel) m.occupancy_pct = index.at(heaviest).kernel->occupancy_pct;
  } else {
    // Copies nested inside other ops (masked_fill's) count too; a dtype
    // conversion's does not (the upcast rule counts those).
    for (EventIndex c : index.ops_named("copy_")) copies += index.is_conversion_copy(c) ? 0 : 1;
    m.device_time_us = m.host_time_us;
  }
  m.copies_per_forward = copies / steps;

  // Memory: the running total's peak inside each forward, above its start.
  std::int64_t peak = 0;
  double allocated = 0;
  for (std::size_t f = 0; f < fw.size(); ++f) {
    std::int64_t start_total = -1, top = 0;
    for (EventIndex i : index.allocations_between(index.call_start_ns(f), index.call_end_ns(f))) {
      const auto& al = *index.at(i).allocation;
      if (start_total < 0) start_total = al.total_allocated - al.bytes;
      top = std::max(top, al.total_allocated - start_total);
      if (al.bytes > 0) allocated += static_cast<double>(al.bytes);
    }
    peak = std::max(peak, top);
  }
  m.peak_bytes = peak;
  m.allocated_bytes_per_forward = allocated / steps;

  if (m.device_time_us && *m.device_time_us > 0) {
    const double seconds = *m.device_time_us * 1e-6;
    const double gpus = std::max(1, t.world_size);
    m.tflops = p.flops() / seconds / 1e12;
    m.gbs = static_cast<double>(p.io_bytes()) / seconds / 1e9;
    // Against the ceilings of every GPU the call ran on (ring attention's --gpus N).
    if (ceiling_tflops > 0) m.ceiling_pct = *m.tflops / (ceiling_tflops * gpus) * 100.0;
    if (copy_gbs > 0) m.copy_ceiling_pct = *m.gbs / (copy_gbs * gpus) * 100.0;
  }
  return m;
}

}  // namespace attnprof::analysis
