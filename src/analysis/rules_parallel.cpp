// The context-parallel rules (--gpus): how much of NCCL's time compute hid,
// how long each rank's compute stood idle, and the load between ranks, read
// from the kernels of every device in one trace (Holistic Trace Analysis's
// communication/computation overlap is the anchor).
#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "analysis/format.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {
namespace {

using namespace rule_support;

using Intervals = std::vector<std::pair<std::int64_t, std::int64_t>>;

bool is_nccl_kernel(const Activity& a) {
  return a.type == ActivityType::Kernel &&
         (a.name.starts_with("ncclDevKernel") || a.name.starts_with("ncclKernel") || a.name.starts_with("nccl"));
}

// Sorted, non-overlapping.
Intervals merged(Intervals iv) {
  std::sort(iv.begin(), iv.end());
  Intervals out;
  for (const auto& [s, e] : iv) {
    if (!out.empty() && s <= out.back().second) {
      out.back().second = std::max(out.back().second, e);
    } else {
      out.emplace_back(s, e);
    }
  }
  return out;
}

double covered_ns(const Intervals& m) {
  double t = 0;
  for (const auto& [s, e] : m) t += static_cast<double>(e - s);
  return t;
}

// Time two merged interval sets share.
double overlap_ns(const Intervals& a, const Intervals& b) {
  double t = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t s = std::max(a[i].first, b[j].first), e = std::min(a[i].second, b[j].second);
    if (e > s) t += static_cast<double>(e - s);
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return t;
}

// Per device, summed over the calls: NCCL kernel time, compute kernel time
// (every other kernel), their overlap, and the time the device's compute
// stood idle inside the call's span over all devices (its wait).
struct DeviceSplit {
  double comm = 0, compute = 0, hidden = 0, wait = 0;
};

std::map<int, DeviceSplit> device_split(const TraceIndex& ix) {
  std::map<int, DeviceSplit> out;
  for (std::size_t c = 0; c < ix.forwards().size(); ++c) {
    std::map<int, std::pair<Intervals, Intervals>> by_device;  // comm, compute
    std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = std::numeric_limits<std::int64_t>::min();
    for (EventIndex i : ix.forward_device(c)) {
      const Activity& a = ix.at(i);
      if (a.type != ActivityType::Kernel || a.device < 0) continue;
      auto& slot = by_device[a.device];
      (is_nccl_kernel(a) ? slot.first : slot.second).emplace_back(a.start_ns, a.end_ns());
      first = std::min(first, a.start_ns);
      last = std::max(last, a.end_ns());
    }
    for (auto& [d, v] : by_device) {
      const Intervals comm = merged(std::move(v.first)), compute = merged(std::move(v.second));
      DeviceSplit& s = out[d];
      s.comm += covered_ns(comm);
      s.compute += covered_ns(compute);
      s.hidden += overlap_ns(comm, compute);
      s.wait += static_cast<double>(last - first) - covered_ns(compute);
    }
  }
  return out;
}

// Holistic Trace Analysis's comm/comp overlap: the share of NCCL kernel time
// that ran while a compute kernel ran on the same device.
}  // namespace

std::vector<Finding> comm_overlap(const RuleInput& in) {
  if (!in.gpu) return {};
  const auto split = device_split(in.index);
  double comm = 0, hidden = 0;
  for (const auto& [d, s] : split) {
    comm += s.comm;
    hidden += s.hidden;
  }
  if (comm <= 0) return {};
  const double pct = hidden / comm * 100;
  Finding f = found(format("communication: %.0f us of NCCL kernel time ", comm / in.steps / 1e3) + per_call(in.index) +
                    " over " + std::to_string(split.size()) +
                    format(" GPU(s), %.1f%% of it hidden behind compute on the same GPU", pct));
  cite_first_forward(f, in.index);
  f.figures = {{"comm_us_per_forward", comm / in.steps / 1e3},
               {"hidden_us_per_forward", hidden / in.steps / 1e3},
               {"comm_hidden_pct", pct}};
  for (const auto& [d, s] : split) {
    if (s.comm > 0) f.figures["comm_hidden_pct_gpu" + std::to_string(d)] = s.hidden / s.comm * 100;
  }
  return {f};
}

// How long each GPU's compute stood idle inside a call while the others
// worked (waiting for a block to arrive, or for the slowest rank).
std::vector<Finding> rank_wait(const RuleInput& in) {
  if (!in.gpu) return {};
  const auto split = device_split(in.index);
  if (split.size() < 2) return {};
  std::string each;
  Finding f;
  double worst = 0;
  for (const auto& [d, s] : split) {
    const double us = s.wait / in.steps / 1e3;
    each += std::string(each.empty() ? "" : ", ") + "GPU " + std::to_string(d) + format(" %.0f us", us);
    f.figures["wait_us_gpu" + std::to_string(d)] = us;
    worst = std::max(worst, us);
  }
  f.text = "rank wait " + per_call(in.index) + " (compute idle inside the call's span): " + each;
  f.figures["wait_us_max"] = worst;
  cite_first_forward(f, in.index);
  return {f};
}

// Compute kernel time per GPU, the largest over the mean: 1 is balanced.
std::vector<Finding> load_imbalance(const RuleInput& in) {
  if (!in.gpu) return {};
  const auto split = device_split(in.index);
  if (split.size() < 2) return {};
  double sum = 0, hi = 0;
  Finding f;
  std::string each;
  for (const auto& [d, s] : split) {
    const double us = s.compute / in.steps / 1e3;
    sum += us;
    hi = std::max(hi, us);
    f.figures["compute_us_gpu" + std::to_string(d)] = us;
    each += std::string(each.empty() ? "" : ", ") + "GPU " + std::to_string(d) + format(" %.0f us", us);
  }
  const double mean = sum / static_cast<double>(split.size());
  if (mean <= 0) return {};
  f.text = format("load imbalance %.3f (compute time per GPU, max over mean): ", hi / mean) + each;
  f.figures["imbalance"] = hi / mean;
  cite_first_forward(f, in.index);
  return {f};
}

}  // namespace attnprof::analysis
