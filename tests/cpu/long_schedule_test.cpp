// Long schedules: the trace keeps its last recorded steps, the older ones are
// folded into the run's figures and table as they leave, so what a run holds
// is the same for N and 10N steps (issue 57 item 2), and the folded figures
// are the ones the whole trace gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "analysis/metrics.h"
#include "analysis/trace_index.h"
#include "attnprof/key_averages.h"
#include "attnprof/profiler.h"
#include "attnprof/runner.h"
#include "attnprof/tensor.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using testing::Shape;
using testing::to_problem;

// A tiny problem, so that thousands of steps take well under a second each
// on a loaded 2-core machine.
Problem tiny_problem() {
  Problem p = to_problem(Shape{.batch = 1, .heads = 1, .seq = 8, .head_dim = 8}, DType::F32, MaskKind::None);
  p.validate();
  return p;
}

RunResult run_steps(int active) {
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = active, .repeat = 1};
  o.check_rows = 8;
  o.threads = 1;
  Backend* naive = find_backend("naive", Device::Cpu);
  EXPECT_NE(naive, nullptr);
  return run_backend(*naive, tiny_problem(), o);
}

const KeyAverage* row(const std::vector<KeyAverage>& rows, const std::string& name) {
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const KeyAverage& r) { return r.name == name; });
  return it == rows.end() ? nullptr : &*it;
}

int profiler_steps(const Trace& t) {
  return static_cast<int>(std::count_if(t.activities.begin(), t.activities.end(), [](const Activity& a) {
    return a.type == ActivityType::UserAnnotation && a.name.starts_with("ProfilerStep#");
  }));
}

// What a run holds after its steps does not grow with them: 10x the steps,
// the same trace (the last steps), and every step still in the figures and
// the table. Before, the trace held every step's events (3.4 KB a step, and
// more from the CLI's compare: GBs for --active 1000 --repeat 100).
TEST(LongSchedule, CpuRunHoldsTheSameForNAndTenTimesNSteps) {
  const int n = 300;
  const RunResult small = run_steps(n);
  const RunResult large = run_steps(10 * n);
  // Same problem, same steps kept: the same events (allowing a few for an
  // allocator that reuses differently).
  const double ratio =
      static_cast<double>(large.trace.activities.size()) / static_cast<double>(small.trace.activities.size());
  EXPECT_LT(ratio, 1.1) << small.trace.activities.size() << " events after " << n << " steps, "
                        << large.trace.activities.size() << " after " << 10 * n;
  for (const RunResult* r : {&small, &large}) {
    ASSERT_FALSE(r->failure) << *r->failure;
    const int steps = r == &small ? n : 10 * n;
    // The figures cover every step.
    EXPECT_EQ(r->metrics.steps, steps);
    EXPECT_EQ(r->trace.steps_recorded, steps);
    // The trace holds a bounded number of the last steps.
    const int kept = profiler_steps(r->trace);
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, n);
    EXPECT_EQ(r->trace.steps_folded + kept, steps);
    // The table too: its rows count every call.
    const KeyAverage* forward = row(r->key_averages, "forward");
    ASSERT_NE(forward, nullptr);
    EXPECT_EQ(forward->count, steps);
    const KeyAverage* step = row(r->key_averages, "ProfilerStep*");
    ASSERT_NE(step, nullptr);
    EXPECT_EQ(step->count, steps);
  }
}

// One step's work as the runner records it: a forward range around two ops,
// one of which allocates and frees a tensor.
void fake_step(int s) {
  RecordFunction forward("forward", "f32", "[1, 1, 8, 8]", ActivityType::UserAnnotation);
  {
    RecordFunction op("aten::matmul");
    const Tensor t = Tensor::empty({1, 1, 8, 8 + (s % 3)}, DType::F32, cpu_allocator());
  }
  RecordFunction op("aten::softmax");
}

// The profiler itself: at most keep + 1 steps held at once, whatever the
// step count; the trace ends with the last `keep` steps; every older step
// reaches the fold whole and alone; and folding the pieces gives the whole
// trace's figures and table rows exactly.
TEST(LongSchedule, ProfilerFoldsOlderStepsAndHoldsAFlatPeak) {
  constexpr int kKeep = 4;
  std::vector<std::size_t> peaks;
  for (const int steps : {40, 400}) {
    SCOPED_TRACE(steps);
    Trace whole;  // the folded steps and the kept ones, put back together
    analysis::MetricSums sums;
    std::vector<KeyAverage> rows;
    const Problem p = tiny_problem();
    int folded = 0;
    {
      Profiler prof(Schedule{.wait = 0, .warmup = 0, .active = steps, .repeat = 1});
      prof.observe(cpu_allocator());
      prof.fold_steps_beyond(kKeep, [&](Trace&& step) {
        EXPECT_EQ(profiler_steps(step), 1);
        EXPECT_EQ(step.activities.front().name, "ProfilerStep#" + std::to_string(folded));
        ++folded;
        analysis::add_to(sums, analysis::TraceIndex(step), p);
        merge_key_averages(rows, key_averages(step));
        whole.activities.insert(whole.activities.end(), step.activities.begin(), step.activities.end());
      });
      prof.start();
      EXPECT_TRUE(prof.folds_steps());
      for (int s = 0; s < steps; ++s) {
        fake_step(s);
        prof.step();
      }
      prof.stop();
      const Trace& kept = prof.trace();
      EXPECT_EQ(folded, steps - kKeep);
      EXPECT_EQ(kept.steps_folded, steps - kKeep);
      EXPECT_EQ(kept.steps_recorded, steps);
      EXPECT_EQ(profiler_steps(kept), kKeep);
      EXPECT_EQ(kept.activities.front().name, "ProfilerStep#" + std::to_string(steps - kKeep));
      peaks.push_back(prof.peak_events());
      analysis::add_to(sums, analysis::TraceIndex(kept), p);
      merge_key_averages(rows, key_averages(kept));
      whole.activities.insert(whole.activities.end(), kept.activities.begin(), kept.activities.end());
    }
    const Metrics all = analysis::measure(whole, p, 0);
    const Metrics fold = analysis::finish(sums, p, 0);
    EXPECT_EQ(fold.steps, steps);
    EXPECT_EQ(fold.steps, all.steps);
    EXPECT_DOUBLE_EQ(fold.host_time_us, all.host_time_us);
    EXPECT_DOUBLE_EQ(fold.ops_per_forward, all.ops_per_forward);
    EXPECT_EQ(fold.peak_bytes, all.peak_bytes);
    EXPECT_GT(fold.peak_bytes, 0);
    EXPECT_DOUBLE_EQ(fold.allocated_bytes_per_forward, all.allocated_bytes_per_forward);
    const std::vector<KeyAverage> want = key_averages(whole);
    ASSERT_EQ(rows.size(), want.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i].name, want[i].name);
      EXPECT_EQ(rows[i].count, want[i].count) << rows[i].name;
      EXPECT_EQ(rows[i].self_cpu_ns, want[i].self_cpu_ns) << rows[i].name;
      EXPECT_EQ(rows[i].cpu_total_ns, want[i].cpu_total_ns) << rows[i].name;
    }
    EXPECT_EQ(key_averages_table(rows), key_averages_table(whole));
  }
  // The events held at once: the same for 10x the steps.
  ASSERT_EQ(peaks.size(), 2u);
  EXPECT_EQ(peaks[0], peaks[1]);
}

// A range open across a step boundary (a caller's, around prof.step())
// holds the steps until it closes: handles into the trace stay valid, and
// the steps are folded then.
TEST(LongSchedule, AnOpenRangeDefersFolding) {
  int folded = 0;
  Profiler prof(Schedule{.wait = 0, .warmup = 0, .active = 10, .repeat = 1});
  prof.fold_steps_beyond(2, [&](Trace&&) { ++folded; });
  prof.start();
  {
    RecordFunction outer("outer");
    for (int s = 0; s < 5; ++s) prof.step();
    EXPECT_EQ(folded, 0);
  }
  for (int s = 5; s < 10; ++s) prof.step();
  prof.stop();
  EXPECT_EQ(folded, 8);
  const auto& acts = prof.trace().activities;
  EXPECT_EQ(profiler_steps(prof.trace()), 2);
  EXPECT_TRUE(std::none_of(acts.begin(), acts.end(), [](const Activity& a) { return a.name == "outer"; }));
}

}  // namespace
}  // namespace attnprof
