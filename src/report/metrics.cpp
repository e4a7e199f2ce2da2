#include "report/metrics.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace attnprof::report {
namespace {

bool contains(const Activity& outer, const Activity& inner) {
  return outer.tid == inner.tid && inner.start_ns >= outer.start_ns && inner.end_ns() <= outer.end_ns();
}

std::vector<const Activity*> forwards(const Trace& t) {
  std::vector<const Activity*> f;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::UserAnnotation && a.name == kForwardRange) f.push_back(&a);
  }
  return f;
}

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

std::vector<std::vector<const Activity*>> forward_ops(const Trace& t) {
  std::vector<std::vector<const Activity*>> out;
  for (const Activity* f : forwards(t)) {
    std::vector<const Activity*> ops;
    for (const auto& a : t.activities) {
      if (a.type == ActivityType::CpuOp && a.depth == f->depth + 1 && contains(*f, a)) ops.push_back(&a);
    }
    out.push_back(std::move(ops));
  }
  return out;
}

std::vector<const Activity*> device_activities(const Trace& t) {
  std::vector<const Activity*> d;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::Kernel || a.type == ActivityType::Memcpy || a.type == ActivityType::Memset) {
      d.push_back(&a);
    }
  }
  return d;
}

const Activity* launch_call(const Trace& t, const Activity& dev) {
  for (const auto& a : t.activities) {
    if ((a.type == ActivityType::CudaRuntime || a.type == ActivityType::CudaDriver) &&
        a.correlation == dev.correlation) {
      return &a;
    }
  }
  return nullptr;
}

const Activity* launching_op(const Trace& t, const Activity& dev, bool outermost) {
  const Activity* launch = launch_call(t, dev);
  if (!launch) return nullptr;
  const Activity* best = nullptr;
  for (const auto& a : t.activities) {
    if (a.type != ActivityType::CpuOp || !contains(a, *launch)) continue;
    if (!best || (outermost ? a.depth < best->depth : a.depth > best->depth)) best = &a;
  }
  return best;
}

Metrics measure(const Trace& t, const Problem& p, double ceiling_tflops) {
  Metrics m;
  const auto fw = forwards(t);
  m.steps = static_cast<int>(fw.size());
  if (fw.empty()) return m;
  const double steps = static_cast<double>(fw.size());

  double host_ns = 0;
  for (const Activity* f : fw) host_ns += static_cast<double>(f->dur_ns);
  m.host_time_us = host_ns / steps / 1e3;

  const auto ops = forward_ops(t);
  double op_count = 0;
  for (const auto& o : ops) op_count += static_cast<double>(o.size());
  m.ops_per_forward = op_count / steps;

  const auto dev = device_activities(t);
  double copies = 0;
  if (p.device == Device::Cuda) {
    std::vector<std::pair<std::int64_t, std::int64_t>> iv;
    std::map<std::string, std::pair<double, const Activity*>> by_kernel;
    for (const Activity* a : dev) {
      iv.emplace_back(a->start_ns, a->end_ns());
      if (a->type == ActivityType::Memcpy) copies += 1;
      if (a->type == ActivityType::Memset) m.memsets_per_forward += 1;
      if (a->type == ActivityType::Kernel) {
        auto& slot = by_kernel[a->name];
        slot.first += static_cast<double>(a->dur_ns);
        slot.second = a;
      }
    }
    m.kernels_per_forward = static_cast<double>(dev.size()) / steps;
    m.memsets_per_forward /= steps;
    if (!dev.empty()) {
      m.device_time_us = union_ns(std::move(iv)) / steps / 1e3;
    } else {
      // No CUPTI: a device-event span per forward, if the fallback recorded one.
      double ns = 0;
      int n = 0;
      for (const auto& a : t.activities) {
        if (a.type == ActivityType::GpuUserAnnotation) {
          ns += static_cast<double>(a.dur_ns);
          ++n;
        }
      }
      if (n) m.device_time_us = ns / n / 1e3;
    }
    const Activity* heaviest = nullptr;
    double heaviest_ns = -1;
    for (auto& [name, v] : by_kernel) {
      if (v.first > heaviest_ns) {
        heaviest_ns = v.first;
        heaviest = v.second;
      }
    }
    if (heaviest && heaviest->kernel) m.occupancy_pct = heaviest->kernel->occupancy_pct;
  } else {
    // Copies nested inside other ops (masked_fill's) count too.
    for (const auto& a : t.activities) {
      if (a.type == ActivityType::CpuOp && a.name == "copy_") copies += 1;
    }
    m.device_time_us = m.host_time_us;
  }
  m.copies_per_forward = copies / steps;

  // Memory: the running total's peak inside each forward, above its start.
  std::int64_t peak = 0;
  double allocated = 0;
  for (const Activity* f : fw) {
    std::int64_t start_total = -1, top = 0;
    for (const auto& a : t.activities) {
      if (a.type != ActivityType::Allocation || !a.allocation) continue;
      if (a.start_ns < f->start_ns || a.start_ns > f->end_ns()) continue;
      const auto& al = *a.allocation;
      if (start_total < 0) start_total = al.total_allocated - al.bytes;
      top = std::max(top, al.total_allocated - start_total);
      if (al.bytes > 0) allocated += static_cast<double>(al.bytes);
    }
    peak = std::max(peak, top);
  }
  m.peak_bytes = peak;
  m.allocated_bytes_per_forward = allocated / steps;

  if (m.device_time_us && *m.device_time_us > 0) {
    m.tflops = p.flops() / (*m.device_time_us * 1e-6) / 1e12;
    if (ceiling_tflops > 0) m.ceiling_pct = *m.tflops / ceiling_tflops * 100.0;
  }
  return m;
}

}  // namespace attnprof::report
