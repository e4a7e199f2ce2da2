// What limits a run: which of the two measured ceilings (the copy one or the
// matrix-product one) bounds it on the roofline and how close it runs to
// that ceiling; and, for split-KV decode, how the keys were split over the
// GPU and what merging the splits cost.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "analysis/format.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {
namespace {

using namespace rule_support;

// "0.50", "4.0", "190": FLOP/byte at the precision its size needs.
std::string intensity_str(double v) { return format(v < 1 ? "%.2f" : v < 10 ? "%.1f" : "%.0f", v); }

// "3.4 TB/s", "812 GB/s", "18.5 GB/s".
std::string rate_str(double gbs) {
  if (gbs >= 1000) return format("%.1f TB/s", gbs / 1000);
  return format(gbs >= 100 ? "%.0f GB/s" : "%.1f GB/s", gbs);
}

// "610 TFLOP/s", "1.5 TFLOP/s", "0.042 TFLOP/s".
std::string tflops_str(double v) { return format(v >= 100 ? "%.0f" : v >= 1 ? "%.1f" : "%.3f", v) + " TFLOP/s"; }

// The kernels of the flash decode path: the split kernel, grid (num_splits,
// kv_heads * row_blocks, batch), then the combine, launched only when
// num_splits > 1, that merges the splits' partial outputs by their log-sum-exp.
constexpr std::string_view kSplitKernel = "flash_decode_splitkv_kernel";
constexpr std::string_view kCombineKernel = "flash_decode_combine_kernel";
// Above this share of the device time per call the combine costs more than
// merging a few partial rows should: the keys were split too finely.
constexpr double kCombineSharePct = 15;

}  // namespace

// The roofline's question. Arithmetic intensity is the pass's FLOPs over the
// least bytes it must move (Problem::io_bytes); the ridge point is the matmul
// ceiling over the copy ceiling. Below the ridge the copy ceiling bounds the
// run, above it the matmul ceiling: the finding says which, and how much of
// that ceiling the run reached. Silent where a ceiling is unknown (neither
// measured nor given) and on traces read from files, whose problem is unknown.
std::vector<Finding> bound(const RuleInput& in) {
  const RunResult& r = in.run;
  const Metrics& m = r.metrics;
  if (!r.source.empty() || !m.ceiling_tflops || !m.copy_ceiling_gbs || !m.tflops || !m.gbs || !m.ceiling_pct ||
      !m.copy_ceiling_pct) {
    return {};
  }
  const double bytes = static_cast<double>(r.problem.io_bytes());
  const double flops = r.problem.flops();
  if (bytes <= 0 || flops <= 0) return {};
  const double intensity = flops / bytes;
  const double ridge = *m.ceiling_tflops * 1e12 / (*m.copy_ceiling_gbs * 1e9);
  const bool memory = intensity < ridge;
  // The ceilings of every GPU the call ran on (--gpus N), as the percentages are.
  const int gpus = std::max(1, m.world_size);
  const std::string times = gpus > 1 ? std::to_string(gpus) + " x " : std::string();
  std::string text = std::string(memory ? "memory-bound: " : "compute-bound: ") + intensity_str(intensity) +
                     " FLOP/byte against a ridge of " + intensity_str(ridge) + "; ";
  if (memory) {
    text += rate_str(*m.gbs) + " moved, " + format("%.0f%%", *m.copy_ceiling_pct) + " of the measured copy ceiling (" +
            times + rate_str(*m.copy_ceiling_gbs) + ")";
  } else {
    text += tflops_str(*m.tflops) + ", " + format("%.0f%%", *m.ceiling_pct) + " of the measured matmul ceiling (" +
            times + tflops_str(*m.ceiling_tflops) + ")";
  }
  Finding f = found(std::move(text));
  cite_first_forward(f, in.index);
  f.figures = {{"intensity_flop_per_byte", intensity},    {"ridge_flop_per_byte", ridge},
               {"memory_bound", memory ? 1.0 : 0.0},      {"limit_pct", memory ? *m.copy_ceiling_pct : *m.ceiling_pct},
               {"io_bytes_per_forward", bytes},           {"gbs", *m.gbs},
               {"copy_ceiling_gbs", *m.copy_ceiling_gbs}, {"tflops", *m.tflops},
               {"ceiling_tflops", *m.ceiling_tflops}};
  return {f};
}

// Split-KV decode: the split count (the split kernel's grid x), the CTAs it
// launched against the SMs, and the combine kernel's time per call and share
// of the device time. Flags (and raises to a warning) a combine above
// kCombineSharePct of the device time that also outlasts the split kernel,
// splits that leave SMs without a CTA where one split more would still fit
// one CTA an SM, and a combine that is missing where the keys were split (or
// present where they were not). Both limits are measured: on the H100 at batch
// 1, 32/8 heads and 2048 keys (docs/perf/decode.md, session 29) the fastest
// split count, 16 (128 CTAs, 4 SMs idle), had a combine of 4.5 of 11.0 us, a
// second kernel's cost that fewer splits do not remove (8 ran 12.8 us); 32 had
// a combine (7.2 us) longer than its split kernel (5.7) and ran 13.1.
std::vector<Finding> split_kv(const RuleInput& in) {
  if (!in.gpu) return {};
  const TraceIndex& ix = in.index;
  EventIndex split = kNone, combine = kNone;
  double splits_launched = 0, split_ns = 0, combines = 0, combine_ns = 0, device_ns = 0;
  for (EventIndex d : ix.device_activities()) {
    const Activity& a = ix.at(d);
    device_ns += static_cast<double>(a.dur_ns);
    if (a.type != ActivityType::Kernel) continue;
    if (a.name.find(kSplitKernel) != std::string::npos) {
      if (split == kNone) split = d;
      splits_launched += 1;
      split_ns += static_cast<double>(a.dur_ns);
    } else if (a.name.find(kCombineKernel) != std::string::npos) {
      if (combine == kNone) combine = d;
      combines += 1;
      combine_ns += static_cast<double>(a.dur_ns);
    }
  }
  if (split == kNone) return {};
  const KernelInfo k = ix.at(split).kernel.value_or(KernelInfo{});
  const int splits = k.grid[0];
  const double ctas = static_cast<double>(k.grid[0]) * k.grid[1] * k.grid[2];
  const int sms = ix.trace().device ? ix.trace().device->num_sms : 0;
  const std::string per = per_call(ix);

  Finding f;
  f.text = "split-KV decode: " + std::to_string(splits) + (splits == 1 ? " split" : " splits") + " (grid " +
           std::to_string(k.grid[0]) + " x " + std::to_string(k.grid[1]) + " x " + std::to_string(k.grid[2]) + ", " +
           format("%.0f CTAs", ctas) + (sms > 0 ? " on " + std::to_string(sms) + " SMs)" : std::string(")"));
  f.figures = {{"splits", splits},
               {"ctas", ctas},
               {"split_kernels_per_forward", splits_launched / in.steps},
               {"combine_kernels_per_forward", combines / in.steps}};
  if (sms > 0) f.figures["sms"] = sms;
  cite(f, ix, split);

  if (combine != kNone) {
    // Of the device time per call as the metrics read it (the busy time),
    // else of the device activities' summed time.
    const double combine_us = combine_ns / in.steps / 1e3;
    const auto& busy = in.run.metrics.device_time_us;
    const double device_us = busy && *busy > 0 ? *busy : device_ns / in.steps / 1e3;
    const double share = device_us > 0 ? combine_us / device_us * 100 : 0;
    f.text += "; combine kernel " + format("%.1f us ", combine_us) + per + format(", %.1f%% of the device time", share);
    f.figures["combine_us_per_forward"] = combine_us;
    f.figures["combine_share_pct"] = share;
    cite(f, ix, combine);
    if (splits <= 1) {
      f.text += "; a combine with one split merges nothing";
      f.severity = Severity::Warning;
    } else if (share > kCombineSharePct && combine_ns > split_ns) {
      f.text += format("; the combine is over %.0f%% of the device time", kCombineSharePct) +
                " and longer than the split kernel: fewer splits";
      f.severity = Severity::Warning;
    } else if (share > kCombineSharePct) {
      f.text += format("; the combine is over %.0f%% of the device time", kCombineSharePct) +
                " but shorter than the split kernel: mostly a second kernel's fixed cost, which fewer splits do not "
                "remove";
    }
  } else if (splits > 1 && in.run.problem.pass == Pass::Forward && in.run.expectation.device_activities == 1) {
    // The backend declared one kernel a forward: its splits merge in the grid (ATTNPROF_DECODE_FUSED_COMBINE).
    f.text += "; no combine kernel: the last split of each tile merges them";
  } else if (splits > 1) {
    f.text += "; no combine kernel ran: the splits' partial outputs were never merged";
    f.severity = Severity::Warning;
  } else {
    f.text += "; no combine (one split writes O itself)";
  }
  // The CTAs one split more adds (a split is a grid's x).
  const double per_split = static_cast<double>(k.grid[1]) * k.grid[2];
  if (sms > 0 && ctas < sms) {
    f.text +=
        format("; %.0f CTAs leave ", ctas) + format("%.0f of the ", sms - ctas) + std::to_string(sms) + " SMs idle";
    f.figures["idle_sms"] = sms - ctas;
    // The most splits the keys allow (a range of at least one key tile each,
    // at most what the combine merges), as the backend's traits declare them;
    // unknown for a trace from a file.
    const Traits& t = in.run.traits;
    const std::int64_t kv_seq = in.run.problem.kv_seq;
    const std::int64_t most =
        t.max_kv_splits > 0 && t.kv_split_keys > 0
            ? std::min<std::int64_t>(t.max_kv_splits, (kv_seq + t.kv_split_keys - 1) / t.kv_split_keys)
            : 0;
    if (kv_seq <= 0 || most == 0) {
      // A trace from elsewhere: how many keys a split takes is not in it, and
      // a short cache (a few dozen keys) may allow no more: said as a maybe.
      f.text +=
          ": more splits might fill them, where the keys allow (the trace does not say how many keys a split "
          "takes)";
    } else if (splits < most && ctas + per_split <= sms) {
      f.text += ": more splits would fill them";
      f.severity = Severity::Warning;
    } else if (splits < most) {
      f.text += format(": one split more (%.0f CTAs) would put two on some SMs", per_split);
    } else {
      f.text += ": the " + std::to_string(kv_seq) + " keys allow no more splits";
    }
  }
  return {f};
}

}  // namespace attnprof::analysis
