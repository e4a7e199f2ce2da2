// analyze on recorded torch.profiler traces of CUDA-graph workloads
// (scripts/record_graph_traces.py, run on a GPU by scripts/gpu.sh graph_traces;
// committed as tests/fixtures/graphs/): transformers' generate() on a static
// cache under torch.compile(mode="reduce-overhead") with SDPA and attnprof, and
// a decode loop captured by hand with torch.cuda.graph with SDPA and an
// attnprof plan. Every attention call inside the replays is found (layers per
// replay, layers x replays in all), its backend named, none of its kernels put
// under another op. Until the files are recorded each test reports skipped,
// naming the file it wants. ATTNPROF_GRAPH_FIXTURES points at another folder
// (gpu.sh's fresh recording).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "analysis/kernel_names.h"
#include "attnprof/analyze.h"
#include "attnprof/report.h"

namespace attnprof {
namespace {

using nlohmann::json;

std::string dir() {
  if (const char* d = std::getenv("ATTNPROF_GRAPH_FIXTURES")) return d;
  return (std::filesystem::path(ATTNPROF_TORCH_FIXTURES) / ".." / "graphs").lexically_normal().string();
}

struct Fixture {
  const char* name;      // key in graph_traces.json and the file's stem
  const char* backend;   // what the calls must say ran; "" any named backend
  bool shapes_expected;  // captured ops record the shapes (not a plan's run)
};

void PrintTo(const Fixture& f, std::ostream* os) { *os << f.name; }

class GraphFixtures : public ::testing::TestWithParam<Fixture> {};

TEST_P(GraphFixtures, EveryReplayedAttentionCallFoundAndNamed) {
  const Fixture& x = GetParam();
  const std::string meta_path = dir() + "/graph_traces.json";
  const std::string path = dir() + "/" + x.name + ".pt.trace.json.gz";
  if (!std::filesystem::exists(meta_path) || !std::filesystem::exists(path)) {
    GTEST_SKIP() << "missing " << path << " (or " << meta_path
                 << "): record it on a GPU with scripts/gpu.sh graph_traces and commit $OUT/graph_traces/ as "
                    "tests/fixtures/graphs/";
  }
  std::ifstream f(meta_path);
  const json meta = json::parse(f);
  ASSERT_TRUE(meta["traces"].contains(x.name)) << meta_path << " lists no " << x.name;
  const json& m = meta["traces"][x.name];
  const int layers = m["layers"];
  const bool captured = m["capture_in_trace"];

  const TraceAnalysis a = analyze_traces({path}).at(0);
  ASSERT_FALSE(a.graph_notes.empty()) << "no CUDA graph replay in " << path << "\n" << analysis_text(a, 3);
  // A step whose device work is all in its replays counted it there: no
  // "not counted" line (the profiler's CUPTI was on throughout).
  for (const StepAnalysis& s : a.steps) {
    for (const Finding& f : s.result.findings) {
      EXPECT_EQ(f.text.find("GPU activities not counted"), std::string::npos) << s.label << ": " << f.text;
    }
  }
  // Every attnprof call of the trace (eager, a compiled graph's warm-up, a
  // replay) names its mask: the op's label is read wherever it ran.
  for (const StepAnalysis& s : a.steps) {
    for (const AttentionCall& c : s.attention.calls) {
      if (c.backend.starts_with("attnprof")) EXPECT_NE(c.mask, "unknown") << s.label << ": " << c.shape;
    }
  }
  int replays = 0, calls = 0;
  for (const StepAnalysis& s : a.steps) {
    if (s.graph_id == 0 || s.attention.calls.empty()) continue;
    ++replays;
    EXPECT_EQ(s.attention.calls.size(), static_cast<std::size_t>(layers)) << s.label << ": one call per layer";
    std::size_t attention_kernels = 0, in_calls = 0;
    for (const Activity& k : s.result.trace.activities) {
      attention_kernels += k.type == ActivityType::Kernel && k.graph_id != 0 &&
                           !analysis::attention_backend_of_kernel(k.name, true).empty();
    }
    // Device work the replay ran goes under the op that captured it: nothing
    // is a hidden copy of "(no op)" (the decode loop's copies are copy_ calls
    // asked for at capture).
    for (const Finding& f : s.result.findings) {
      EXPECT_EQ(f.text.find("(no op)"), std::string::npos) << s.label << ": " << f.text;
    }
    for (const AttentionCall& c : s.attention.calls) {
      ++calls;
      EXPECT_NE(c.backend, "unknown") << s.label << " layer " << c.layer;
      if (*x.backend) {
        EXPECT_EQ(c.backend, x.backend) << s.label << " layer " << c.layer;
      }
      EXPECT_FALSE(c.kernels.empty());
      in_calls += c.kernels.size();
      if (captured && x.shapes_expected) {
        EXPECT_EQ(c.found_by, "capture") << s.label << "\n" << analysis_text(a, 3);
        EXPECT_TRUE(c.problem) << s.label << " layer " << c.layer;
        // The op's label (its mask) is read inside the op, compiled or not.
        EXPECT_NE(c.mask, "unknown") << s.label << " layer " << c.layer;
        EXPECT_TRUE(c.flops) << s.label << " layer " << c.layer << ": " << c.mask;
      }
    }
    // None attributed to another op: every kernel that names attention is a call's.
    EXPECT_LE(attention_kernels, in_calls) << s.label;
  }
  EXPECT_GT(replays, 0) << analysis_text(a, 3);
  EXPECT_EQ(calls, layers * replays) << "count = layers x replays";
  if (!m["replays"].is_null()) {
    EXPECT_EQ(replays, m["replays"].get<int>()) << "the replays the script made";
  }
}

INSTANTIATE_TEST_SUITE_P(Recorded, GraphFixtures,
                         ::testing::Values(Fixture{"decode_sdpa", "", true},
                                           Fixture{"decode_plan", "attnprof:flash", false},
                                           Fixture{"generate_sdpa", "", true},
                                           Fixture{"generate_attnprof", "attnprof:flash", true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace attnprof
