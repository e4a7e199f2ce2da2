// The host time a report shows: the call with no profiler attached (its
// median and spread) in the table and the JSON, and what the CPU-bound finding
// is judged on; the profiled call's time where no unprofiled calls were made.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/findings.h"
#include "analysis/format.h"
#include "attnprof/error.h"
#include "attnprof/report.h"
#include "attnprof/runner.h"
#include "findings_lookup.h"
#include "report/json.h"

namespace attnprof {
namespace {

using testing::only;

// A GPU result made by hand: 10 us of kernel time, 40 us of host time per call
// under the profiler, `unprofiled` without it.
RunResult gpu_result(double unprofiled) {
  RunResult r;
  r.backend = "cudnn";
  r.problem = Problem{};
  r.problem.device = Device::Cuda;
  r.eligibility.eligible = true;
  r.metrics.steps = 3;
  r.metrics.kernels_per_forward = 1;
  r.metrics.device_time_us = 10;
  r.metrics.host_time_us = 40;
  r.metrics.host_time_unprofiled_us = unprofiled;
  r.metrics.host_time_unprofiled_p10_us = unprofiled - 1;
  r.metrics.host_time_unprofiled_p90_us = unprofiled + 3;
  return r;
}

TEST(ReportHostTime, TheUnprofiledCallIsWhatTheTableShowsAndWhatCpuBoundIsJudgedOn) {
  std::vector<RunResult> fast{gpu_result(12)};
  const std::string t = compare_table(fast);
  EXPECT_NE(t.find("12.0 us"), std::string::npos) << t;
  EXPECT_EQ(t.find("40.0 us"), std::string::npos) << t;
  EXPECT_NE(t.find("no profiler attached"), std::string::npos) << t;
  const nlohmann::json j = report::result_json(fast[0]);
  EXPECT_DOUBLE_EQ(j["host_time_unprofiled_us"].get<double>(), 12);
  EXPECT_DOUBLE_EQ(j["host_time_unprofiled_p10_us"].get<double>(), 11);
  EXPECT_DOUBLE_EQ(j["host_time_unprofiled_p90_us"].get<double>(), 15);
  EXPECT_DOUBLE_EQ(j["host_time_us"].get<double>(), 40);
  auto cpu_bound = [](const std::vector<Finding>& findings) {
    return std::any_of(findings.begin(), findings.end(),
                       [](const Finding& f) { return f.text.rfind("CPU-bound", 0) == 0; });
  };
  // 40 us profiled would call 10 us of GPU work CPU-bound; 12 us unprofiled does not.
  EXPECT_FALSE(cpu_bound(analysis::findings(fast[0], fast, {})));
  std::vector<RunResult> slow{gpu_result(25)};
  const auto f = analysis::findings(slow[0], slow, {});
  ASSERT_TRUE(cpu_bound(f));
  const Finding& bound = only(f, "cpu-bound");
  EXPECT_EQ(bound.text, "CPU-bound: 25 us of host time per call for 10 us of GPU work");
  EXPECT_EQ(bound.severity, Severity::Warning);
  EXPECT_DOUBLE_EQ(bound.figures.at("host_us"), 25);
  EXPECT_DOUBLE_EQ(bound.figures.at("device_us"), 10);
}

TEST(ReportHostTime, SpreadOfCallsIsTheSampleAtRoundedRank) {
  // One call: every percentile is that call.
  Spread one = spread_of({7.5});
  EXPECT_EQ(one.p10, 7.5);
  EXPECT_EQ(one.p50, 7.5);
  EXPECT_EQ(one.p90, 7.5);
  // Two: p10 the faster, p50 and p90 the slower (round(0.5) = 1).
  Spread two = spread_of({9, 3});
  EXPECT_EQ(two.p10, 3);
  EXPECT_EQ(two.p50, 9);
  EXPECT_EQ(two.p90, 9);
  // 32 calls of 1..32 us, shuffled: ranks round(3.1) = 3, round(15.5) = 16, round(27.9) = 28.
  std::vector<double> calls;
  for (int i = 0; i < 32; ++i) calls.push_back((i * 7) % 32 + 1);  // 7 is prime to 32: a permutation
  const Spread s = spread_of(calls);
  EXPECT_EQ(s.p10, 4);
  EXPECT_EQ(s.p50, 17);
  EXPECT_EQ(s.p90, 29);
  EXPECT_THROW(spread_of({}), Error);
}

TEST(ReportHostTime, NoNoteWithoutUnprofiledCalls) {
  RunResult r = gpu_result(0);
  r.metrics.host_time_unprofiled_us.reset();
  std::vector<RunResult> all{r};
  const std::string t = compare_table(all);
  EXPECT_NE(t.find("40.0 us"), std::string::npos) << t;
  EXPECT_EQ(t.find("no profiler attached"), std::string::npos) << t;
  EXPECT_TRUE(report::result_json(r)["host_time_unprofiled_us"].is_null());
}

}  // namespace
}  // namespace attnprof
