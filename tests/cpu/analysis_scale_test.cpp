// The analysis layer at scale: the trace index, the metrics and every rule
// over a million events of repeated synthetic forwards, within seconds, and
// with the same figures and findings as one forward.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "analysis/findings.h"
#include "analysis/metrics.h"
#include "analysis/rules.h"
#include "analysis/trace_index.h"
#include "findings_lookup.h"
#include "synthetic_trace.h"

namespace attnprof {
namespace {

using analysis::TraceIndex;
using testing::attention_trace;
using testing::by_rule;
using testing::dump;

// `forwards` copies of the synthetic forward, each in its own ProfilerStep,
// 1 ms apart, with their own correlation ids.
Trace repeated_trace(int forwards) {
  const Trace one = attention_trace();
  Trace t = one;
  t.activities.clear();
  t.activities.reserve(one.activities.size() * static_cast<std::size_t>(forwards));
  for (int k = 0; k < forwards; ++k) {
    for (const Activity& a : one.activities) {
      Activity c = a;
      c.start_ns += std::int64_t{k} * 1'000'000;
      if (c.correlation) c.correlation += static_cast<std::uint64_t>(k) * 10;
      if (c.name == "ProfilerStep#1") c.name = "ProfilerStep#" + std::to_string(k);
      t.activities.push_back(std::move(c));
    }
  }
  t.steps_recorded = forwards;
  return t;
}

TEST(AnalysisScale, AMillionEventsIndexedAndReadInSeconds) {
  const int forwards = 1'000'000 / static_cast<int>(attention_trace().activities.size()) + 1;
  RunResult r;
  r.backend = "naive";
  r.problem.device = Device::Cuda;
  r.eligibility.eligible = true;
  r.expectation.device_activities = 6;
  r.expectation.cpu_ops = {"matmul", "mul", "masked_fill", "softmax", "matmul"};
  r.trace = repeated_trace(forwards);
  ASSERT_GE(r.trace.activities.size(), 1'000'000u);

  const auto t0 = std::chrono::steady_clock::now();
  const TraceIndex ix(r.trace);
  r.metrics = analysis::measure(ix, r.problem, 0);
  const auto fs = analysis::findings(ix, r, {}, {{"naive", 6}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#ifdef NDEBUG
  constexpr double kBound = 10;
#else
  constexpr double kBound = 60;  // unoptimised and sanitised builds
#endif
  EXPECT_LT(seconds, kBound) << "index, metrics and rules over " << r.trace.activities.size() << " events";
  std::printf("[ info ] %zu events: index, metrics and %zu rules in %.2f s\n", r.trace.activities.size(),
              analysis::rule_table().size(), seconds);

  EXPECT_EQ(r.metrics.steps, forwards);
  EXPECT_EQ(ix.profiler_steps().size(), static_cast<std::size_t>(forwards));
  EXPECT_DOUBLE_EQ(*r.metrics.kernels_per_forward, 6);
  EXPECT_DOUBLE_EQ(r.metrics.copies_per_forward, 1);
  EXPECT_DOUBLE_EQ(r.metrics.ops_per_forward, 5);
  EXPECT_EQ(r.metrics.peak_bytes, 33'554'432);
  EXPECT_EQ(ix.forward_device(static_cast<std::size_t>(forwards - 1)).size(), 6u);
  const Finding* copy = by_rule(fs, "hidden-copy");
  ASSERT_TRUE(copy) << dump(fs);
  EXPECT_EQ(copy->text, "hidden copy: masked_fill (its copy_) makes 1 device-to-device copy per forward (32.0 MiB)");
  EXPECT_LE(copy->evidence.size(), 16u);
  EXPECT_TRUE(by_rule(fs, "guess-confirmed")) << dump(fs);
  EXPECT_FALSE(by_rule(fs, "expectation-mismatch")) << dump(fs);
  EXPECT_FALSE(by_rule(fs, "op-sequence-mismatch")) << dump(fs);
}

}  // namespace
}  // namespace attnprof
