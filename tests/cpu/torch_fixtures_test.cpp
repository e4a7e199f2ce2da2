// analyze tells the story from PyTorch's own traces: torch.profiler traces of
// attention variants recorded on an H200 and on the CPU
// (scripts/record_torch_fixtures.py; tests/fixtures/torch/), read by the same
// rule table as compare.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "attnprof/analyze.h"

namespace attnprof {
namespace {

struct Story {
  const char* fixture;
  std::set<std::string> rules;      // fire on every step
  std::set<std::string> not_rules;  // fire on none
  int kernels = -1;                 // device activities' kernels per step, where known
};

void PrintTo(const Story& s, std::ostream* os) { *os << s.fixture; }

class TorchFixtures : public ::testing::TestWithParam<Story> {};

TEST_P(TorchFixtures, AnalyzeTellsTheStory) {
  const Story& s = GetParam();
  const std::string path = std::string(ATTNPROF_TORCH_FIXTURES) + "/" + s.fixture + ".pt.trace.json.gz";
  const std::vector<TraceAnalysis> all = analyze_traces({path});
  ASSERT_EQ(all.size(), 1u);
  ASSERT_EQ(all[0].steps.size(), 2u) << "schedule(wait=0, warmup=1, active=2): two recorded steps";
  for (const StepAnalysis& step : all[0].steps) {
    std::set<std::string> fired;
    std::string texts;
    for (const Finding& f : step.result.findings) {
      fired.insert(f.rule);
      texts += "\n  " + f.rule + ": " + f.text;
    }
    for (const auto& r : s.rules)
      EXPECT_TRUE(fired.count(r)) << s.fixture << " " << step.label << " lacks " << r << texts;
    for (const auto& r : s.not_rules)
      EXPECT_FALSE(fired.count(r)) << s.fixture << " " << step.label << ": " << r << texts;
    if (s.kernels >= 0) EXPECT_EQ(step.kernels, s.kernels) << s.fixture << " " << step.label;
  }
}

INSTANTIATE_TEST_SUITE_P(
    PyTorch, TorchFixtures,
    ::testing::Values(
        // naive: 2 GEMMs, the scale, the fill and the softmax, plus the hidden DtoD copy of masked_fill.
        Story{"cuda_naive", {"hidden-copy"}, {"fp32-gemm", "upcast-fp32", "mask-rebuilt"}, 6},
        // SDPA math: upcasts, FP32 GEMMs on CUDA cores, the mask rebuilt, the NaN-safe softmax; the
        // conversions' own copies are not hidden copies.
        Story{"cuda_math", {"upcast-fp32", "fp32-gemm", "mask-rebuilt", "nan-safe-softmax"}, {"hidden-copy"}},
        Story{"cuda_efficient", {"one-fused-kernel", "low-occupancy"}, {"hidden-copy", "fp32-gemm"}, 1},
        Story{"cuda_flash", {"one-fused-kernel", "low-occupancy"}, {"hidden-copy", "fp32-gemm"}, 1},
        // cuDNN: its generated kernel through cuLaunchKernelEx, occupancy computed from the record.
        Story{"cuda_cudnn", {"launch-kernel-ex", "low-occupancy"}, {"hidden-copy"}, 1},
        // One training step (flash forward and backward).
        Story{"cuda_train", {"low-occupancy"}, {"fp32-gemm", "upcast-fp32"}},
        Story{"cpu_naive", {"hidden-copy"}, {"masked-fill-in-place"}},
        Story{"cpu_naive_inplace", {"masked-fill-in-place"}, {"hidden-copy"}},
        Story{"cpu_math", {"mask-rebuilt", "nan-safe-softmax"}, {"hidden-copy"}}),
    [](const auto& info) { return std::string(info.param.fixture); });

TEST(TorchFixtures, DiffOfNaiveAndInplaceSeesTheCopyVanish) {
  const std::string dir = ATTNPROF_TORCH_FIXTURES;
  const TraceDiff d = diff_traces({dir + "/cpu_naive.pt.trace.json.gz", std::nullopt},
                                  {dir + "/cpu_naive_inplace.pt.trace.json.gz", {}});
  bool copy_only_in_a = false;
  for (const Finding& f : d.only_a) copy_only_in_a |= f.rule == "hidden-copy";
  EXPECT_TRUE(copy_only_in_a);
  bool fill_in_place_only_in_b = false;
  for (const Finding& f : d.only_b) fill_in_place_only_in_b |= f.rule == "masked-fill-in-place";
  EXPECT_TRUE(fill_in_place_only_in_b);
}

}  // namespace
}  // namespace attnprof
