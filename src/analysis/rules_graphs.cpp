// The CUDA graph rule: attention replayed from a graph that runs below a
// stated share of its roof. A decode (below the roofline's ridge: it moves
// more bytes than it computes) is read against the memory bandwidth, a
// prefill against the tensor-core ceiling; the finding names the replay's
// layers, the share, the ceiling and where it came from, and what would be
// faster. Only calls tied to their capture have shapes (graph_replays.h):
// calls found by kernel names alone are not judged.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/attention_calls.h"
#include "analysis/format.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {
namespace {

using namespace rule_support;

// Below this share of its roof a replayed attention call is flagged.
constexpr double kRoofSharePct = 50;

// A device's datasheet peaks (dense 16-bit tensor-core TFLOP/s, HBM GB/s),
// by the name Kineto writes in deviceProperties; read only where no ceiling
// was given (--ceiling-tflops, ATTNPROF_CEILING_TFLOPS, ATTNPROF_COPY_GBS),
// and the finding says so, as a measured ceiling sits below these.
struct Peaks {
  const char* name;  // a part of the device's name
  double tflops, gbs;
  const char* label;
};
constexpr Peaks kPeaks[] = {
    {"H200", 989.4, 4800, "the H200's datasheet peak"},
    {"H100 PCIe", 756.0, 2000, "the H100 PCIe's datasheet peak"},
    {"H100 NVL", 835.5, 3900, "the H100 NVL's datasheet peak"},
    {"H100", 989.4, 3350, "the H100 SXM's datasheet peak"},
    {"A100-SXM4-80GB", 312.0, 2039, "the A100 80GB's datasheet peak"},
    {"A100 80GB", 312.0, 1935, "the A100 80GB PCIe's datasheet peak"},
    {"A100", 312.0, 1555, "the A100 40GB's datasheet peak"},
};

const Peaks* peaks_of(const RuleInput& in) {
  if (!in.index.trace().device) return nullptr;
  const std::string& name = in.index.trace().device->name;
  for (const Peaks& p : kPeaks) {
    if (name.find(p.name) != std::string::npos) return &p;
  }
  return nullptr;
}

// "3, 5-8, 12": layer numbers as ranges.
std::string layers_str(std::vector<int> l) {
  std::sort(l.begin(), l.end());
  std::string s;
  for (std::size_t i = 0; i < l.size();) {
    std::size_t j = i;
    while (j + 1 < l.size() && l[j + 1] == l[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(l[i]);
    if (j > i) s += "-" + std::to_string(l[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

std::vector<Finding> graph_attention_roof(const RuleInput& in) {
  if (in.attention == nullptr || !in.gpu) return {};
  const Peaks* peaks = peaks_of(in);
  struct Group {
    Finding f;
    std::vector<int> layers;
    double pct = 0, low = 100, rate = 0, ceiling = 0;
    std::string source;
    const AttentionCall* first = nullptr;
  };
  // Calls of one problem and backend judged together: a model's layers share one.
  std::map<std::tuple<std::string, std::string, std::string, bool>, Group> groups;
  for (const AttentionCall& c : *in.attention) {
    if (c.graph_id == 0 || !c.problem || !c.flops || !c.bytes || c.gpu_us <= 0 || !c.tflops || !c.gbs) continue;
    // The ceilings: given ones (the call's percentages say them), else the datasheet's.
    std::optional<double> tflops_roof, gbs_roof;
    std::string tflops_from = "the given ceiling", gbs_from = "the given bandwidth";
    if (c.ceiling_pct && *c.ceiling_pct > 0) tflops_roof = *c.tflops * 100 / *c.ceiling_pct;
    if (c.bandwidth_pct && *c.bandwidth_pct > 0) gbs_roof = *c.gbs * 100 / *c.bandwidth_pct;
    if (!tflops_roof && peaks) {
      tflops_roof = peaks->tflops;
      tflops_from = peaks->label;
    }
    if (!gbs_roof && peaks) {
      gbs_roof = peaks->gbs;
      gbs_from = peaks->label;
    }
    // Decode or prefill: which side of the ridge its intensity falls.
    const double intensity = *c.flops / *c.bytes;
    const bool memory = tflops_roof && gbs_roof ? intensity < *tflops_roof * 1e3 / *gbs_roof : c.problem->seq <= 16;
    const std::optional<double> roof = memory ? gbs_roof : tflops_roof;
    if (!roof) continue;
    const double rate = memory ? *c.gbs : *c.tflops;
    const double pct = 100 * rate / *roof;
    if (pct >= kRoofSharePct) continue;
    Group& g = groups[{c.backend, c.shape + " " + c.mask + " " + c.dtype, c.op, memory}];
    if (!g.first) {
      g.first = &c;
      g.ceiling = *roof;
      g.source = memory ? gbs_from : tflops_from;
    }
    g.layers.push_back(c.layer);
    g.pct = std::max(g.pct, pct);
    g.low = std::min(g.low, pct);
    g.rate = std::max(g.rate, rate);
    cite(g.f, in.index, static_cast<EventIndex>(c.event));
  }
  std::vector<Finding> out;
  const int sms = in.index.trace().device ? in.index.trace().device->num_sms : 0;
  for (auto& [key, g] : groups) {
    const auto& [backend, problem, op, memory] = key;
    const AttentionCall& c = *g.first;
    std::string text =
        "graph " + std::to_string(c.graph_id) + ", layer" + (g.layers.size() == 1 ? " " : "s ") + layers_str(g.layers) +
        ": " + (memory ? "decode" : "prefill") + " attention (" + backend + ", " + problem + ") at " +
        (g.pct - g.low >= 0.5 ? "up to " : "") + format("%.0f%%", g.pct) + " of the " +
        (memory ? "HBM bandwidth (" + format("%.0f GB/s of ", g.rate) + format("%.0f GB/s, ", g.ceiling)
                : "tensor-core roof (" + format("%.1f TFLOP/s of ", g.rate) + format("%.0f TFLOP/s, ", g.ceiling)) +
        g.source + "), below " + format("%.0f%%", kRoofSharePct) + ": ";
    // What would be faster: a decode whose grid leaves SMs idle wants its keys
    // split; a prefill on an unfused path wants a fused kernel; otherwise the
    // replay measures the alternatives on this very problem.
    const Activity& first = in.index.at(static_cast<EventIndex>(c.event));
    double ctas = 0;
    if (first.kernel) ctas = static_cast<double>(first.kernel->grid[0]) * first.kernel->grid[1] * first.kernel->grid[2];
    const bool fused = backend != "math" && backend != "unknown";
    if (memory && sms > 0 && ctas > 0 && ctas < sms) {
      text += format("its %.0f CTAs leave ", ctas) + format("%.0f of the ", sms - ctas) + std::to_string(sms) +
              " SMs idle: a split-KV decode kernel (attnprof's flash decode path, FlashDecoding) spreads the keys "
              "over them";
    } else if (!memory && !fused) {
      text += "a fused kernel (flash, cudnn) keeps the scores on chip and runs on the tensor cores";
    } else {
      text += "attnprof analyze --replay measures attnprof's backends on this problem";
    }
    g.f.text = std::move(text);
    g.f.severity = Severity::Warning;
    g.f.figures = {{"graph_id", static_cast<double>(c.graph_id)},
                   {"layers", static_cast<double>(g.layers.size())},
                   {"roof_pct", g.pct},
                   {"roof", g.ceiling},
                   {"memory_bound", memory ? 1.0 : 0.0},
                   {"threshold_pct", kRoofSharePct}};
    out.push_back(std::move(g.f));
  }
  return out;
}

}  // namespace attnprof::analysis
