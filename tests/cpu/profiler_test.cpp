// The profiler core: the schedule (torch.profiler.schedule semantics), nested
// RecordFunction ranges, step annotations, and collectors.
#include "attnprof/profiler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "attnprof/error.h"

namespace attnprof {
namespace {

using Action = Schedule::Action;

// torch.profiler.schedule(wait, warmup, active, repeat, skip_first=0), transcribed.
Action torch_schedule(int wait, int warmup, int active, int repeat, int step) {
  const int num_steps = wait + warmup + active;
  if (repeat > 0 && static_cast<double>(step) / num_steps >= repeat) return Action::None;
  const int mod_step = step % num_steps;
  if (mod_step < wait) return Action::None;
  if (mod_step < wait + warmup) return Action::Warmup;
  return mod_step < num_steps - 1 ? Action::Record : Action::RecordAndSave;
}

const char* name(Action a) {
  constexpr std::array<const char*, 4> kNames{"NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"};  // the enum's order
  return kNames[static_cast<std::size_t>(a)];
}

TEST(Schedule, ExplicitSequence) {
  const Schedule s{.wait = 1, .warmup = 1, .active = 2, .repeat = 2};
  const Action want[] = {Action::None, Action::Warmup, Action::Record, Action::RecordAndSave,
                         Action::None, Action::Warmup, Action::Record, Action::RecordAndSave,
                         Action::None, Action::None,   Action::None};
  for (int i = 0; i < static_cast<int>(std::size(want)); ++i) {
    EXPECT_EQ(s.at(i), want[i]) << "step " << i << ": " << name(s.at(i)) << " vs " << name(want[i]);
  }
  EXPECT_EQ(s.total_steps(), 8);
}

TEST(Schedule, ActiveOneIsRecordAndSaveOnly) {
  const Schedule s{.wait = 0, .warmup = 0, .active = 1, .repeat = 3};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.at(i), Action::RecordAndSave) << i;
  EXPECT_EQ(s.at(3), Action::None);
  EXPECT_EQ(s.total_steps(), 3);
}

TEST(Schedule, RepeatZeroCyclesForever) {
  const Schedule s{.wait = 2, .warmup = 1, .active = 3, .repeat = 0};
  EXPECT_EQ(s.at(6 * 1000 + 0), Action::None);
  EXPECT_EQ(s.at(6 * 1000 + 2), Action::Warmup);
  EXPECT_EQ(s.at(6 * 1000 + 3), Action::Record);
  EXPECT_EQ(s.at(6 * 1000 + 5), Action::RecordAndSave);
}

TEST(Schedule, MatchesTorchProfilerScheduleEverywhere) {
  for (int wait = 0; wait <= 3; ++wait)
    for (int warmup = 0; warmup <= 3; ++warmup)
      for (int active = 1; active <= 4; ++active)
        for (int repeat = 0; repeat <= 3; ++repeat) {
          const Schedule s{.wait = wait, .warmup = warmup, .active = active, .repeat = repeat};
          for (int step = 0; step < 40; ++step) {
            ASSERT_EQ(s.at(step), torch_schedule(wait, warmup, active, repeat, step))
                << "wait " << wait << " warmup " << warmup << " active " << active << " repeat " << repeat << " step "
                << step << ": got " << name(s.at(step));
          }
          if (repeat > 0) {
            EXPECT_EQ(s.total_steps(), repeat * (wait + warmup + active));
            // The last step of the schedule saves, the one after it does nothing.
            EXPECT_EQ(s.at(s.total_steps() - 1), Action::RecordAndSave);
            EXPECT_EQ(s.at(s.total_steps()), Action::None);
          }
        }
}

TEST(Schedule, DefaultIsOneWarmupThreeActive) {
  const Schedule s;
  EXPECT_EQ(s.at(0), Action::Warmup);
  EXPECT_EQ(s.at(1), Action::Record);
  EXPECT_EQ(s.at(3), Action::RecordAndSave);
  EXPECT_EQ(s.total_steps(), 4);
}

const Activity* find_in(const std::vector<const Activity*>& v, const std::string& n) {
  for (const Activity* a : v) {
    if (a->name == n) return a;
  }
  return nullptr;
}

bool contains(const Activity& outer, const Activity& inner) {
  return inner.start_ns >= outer.start_ns && inner.end_ns() <= outer.end_ns() && inner.tid == outer.tid;
}

TEST(Profiler, RecordsNestedRangesOnlyInActiveSteps) {
  const Schedule s{.wait = 1, .warmup = 1, .active = 2, .repeat = 1};
  Profiler prof(s);
  EXPECT_EQ(Profiler::current(), nullptr);
  prof.start();
  EXPECT_EQ(Profiler::current(), &prof);
  std::vector<bool> recording;
  for (int step = 0; step < s.total_steps(); ++step) {
    EXPECT_EQ(prof.current_step(), step);
    recording.push_back(prof.recording());
    {
      RecordFunction outer("outer", "bf16", "[1, 2]");
      {
        RecordFunction inner("inner");
        RecordFunction leaf("leaf");
      }
      RecordFunction sibling("sibling");
    }
    prof.step();
  }
  prof.stop();
  EXPECT_EQ(Profiler::current(), nullptr);
  EXPECT_EQ(recording, (std::vector<bool>{false, false, true, true}));

  const Trace& t = prof.trace();
  EXPECT_EQ(t.steps_recorded, 2);
  EXPECT_TRUE(std::is_sorted(t.activities.begin(), t.activities.end(),
                             [](const Activity& a, const Activity& b) { return a.start_ns < b.start_ns; }));
  ASSERT_FALSE(t.activities.empty());
  EXPECT_EQ(t.base_ns, t.activities.front().start_ns);

  std::vector<const Activity*> steps;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::UserAnnotation) steps.push_back(&a);
  }
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0]->name, "ProfilerStep#2");
  EXPECT_EQ(steps[1]->name, "ProfilerStep#3");
  EXPECT_LE(steps[0]->end_ns(), steps[1]->start_ns);

  for (int k = 0; k < 2; ++k) {
    const Activity& st = *steps[static_cast<std::size_t>(k)];
    std::vector<const Activity*> ops;
    for (const auto& a : t.activities) {
      if (a.type == ActivityType::CpuOp && a.step == k + 2) ops.push_back(&a);
    }
    ASSERT_EQ(ops.size(), 4u) << "step " << k + 2;
    const Activity* outer = find_in(ops, "outer");
    const Activity* inner = find_in(ops, "inner");
    const Activity* leaf = find_in(ops, "leaf");
    const Activity* sibling = find_in(ops, "sibling");
    ASSERT_TRUE(outer && inner && leaf && sibling);
    EXPECT_EQ(st.depth, 0);
    EXPECT_EQ(outer->depth, st.depth + 1);
    EXPECT_EQ(inner->depth, outer->depth + 1);
    EXPECT_EQ(leaf->depth, inner->depth + 1);
    EXPECT_EQ(sibling->depth, outer->depth + 1);
    EXPECT_TRUE(contains(st, *outer));
    EXPECT_TRUE(contains(*outer, *inner));
    EXPECT_TRUE(contains(*inner, *leaf));
    EXPECT_TRUE(contains(*outer, *sibling));
    EXPECT_FALSE(contains(*inner, *sibling));
    EXPECT_LE(inner->end_ns(), sibling->start_ns);
    EXPECT_EQ(outer->input_dtypes, "bf16");
    EXPECT_EQ(outer->input_dims, "[1, 2]");
    EXPECT_EQ(outer->tid, st.tid);
    EXPECT_GT(outer->pid, 0);
  }
  // Nothing from the wait and warmup steps.
  for (const auto& a : t.activities) EXPECT_GE(a.step, 2) << a.name;
}

TEST(Profiler, RepeatedCyclesRecordEachActiveStep) {
  const Schedule s{.wait = 0, .warmup = 1, .active = 1, .repeat = 3};
  Profiler prof(s);
  prof.start();
  for (int step = 0; step < 8; ++step) {  // two steps past the end record nothing
    RecordFunction op("op");
    prof.step();
  }
  prof.stop();
  std::vector<std::string> steps;
  int ops = 0;
  for (const auto& a : prof.trace().activities) {
    if (a.type == ActivityType::UserAnnotation) steps.push_back(a.name);
    if (a.type == ActivityType::CpuOp) ++ops;
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"ProfilerStep#1", "ProfilerStep#3", "ProfilerStep#5"}));
  EXPECT_EQ(ops, 3);
  EXPECT_EQ(prof.trace().steps_recorded, 3);
}

TEST(Profiler, RecordFunctionWithoutProfilerIsANoOp) {
  ASSERT_EQ(Profiler::current(), nullptr);
  { RecordFunction rf("nobody listens"); }
  Profiler prof(Schedule{.wait = 0, .warmup = 0, .active = 1, .repeat = 1});
  { RecordFunction before("before start"); }
  prof.start();
  { RecordFunction during("during"); }
  prof.stop();
  { RecordFunction after("after stop"); }
  int ops = 0;
  for (const auto& a : prof.trace().activities) {
    if (a.type == ActivityType::CpuOp) {
      EXPECT_EQ(a.name, "during");
      ++ops;
    }
  }
  EXPECT_EQ(ops, 1);
}

TEST(Profiler, OnlyOneActiveAtATime) {
  Profiler a(Schedule{.wait = 0, .warmup = 0, .active = 1, .repeat = 1});
  Profiler b(Schedule{.wait = 0, .warmup = 0, .active = 1, .repeat = 1});
  a.start();
  EXPECT_THROW(b.start(), Error);
  EXPECT_THROW(a.start(), Error);
  a.stop();
  EXPECT_NO_THROW(b.start());
  b.stop();
  Profiler c;
  EXPECT_THROW(c.step(), Error);  // step() before start()
}

TEST(Profiler, DestructorStopsAndReleasesCurrent) {
  {
    Profiler p(Schedule{.wait = 0, .warmup = 0, .active = 2, .repeat = 1});
    p.start();
    RecordFunction r("x");
  }
  EXPECT_EQ(Profiler::current(), nullptr);
}

// A collector that makes one launch and its device activity per step, at
// times the test controls, plus one launch outside every step.
class FakeCollector : public Collector {
 public:
  explicit FakeCollector(bool fail_start) : fail_start_(fail_start) {}
  std::string name() const override { return "fake"; }
  void start() override {
    if (fail_start_) fail(ErrorKind::Device, "no device here");
  }
  void stop() override {}
  void drain(std::vector<Activity>& out) override {
    for (auto& a : pending) out.push_back(a);
    pending.clear();
  }
  std::string note() const override { return "fake note"; }

  void launch(std::uint64_t corr) {
    Activity api;
    api.type = ActivityType::CudaRuntime;
    api.name = "cudaLaunchKernel";
    api.start_ns = now_ns();
    api.dur_ns = 1;
    api.correlation = corr;
    Activity k;
    k.type = ActivityType::Kernel;
    k.name = "kernel_" + std::to_string(corr);
    k.start_ns = api.start_ns + 1000000000;  // runs long after the step ended: kept by correlation
    k.dur_ns = 10;
    k.correlation = corr;
    pending.push_back(api);
    pending.push_back(k);
  }

  std::vector<Activity> pending;

 private:
  bool fail_start_;
};

TEST(Profiler, CollectorActivitiesKeptByCorrelationToRecordedSteps) {
  Profiler prof(Schedule{.wait = 0, .warmup = 1, .active = 1, .repeat = 1});
  auto owned = std::make_unique<FakeCollector>(false);
  FakeCollector* fake = owned.get();
  prof.add_collector(std::move(owned));
  prof.start();
  fake->launch(1);  // warmup step: dropped with its kernel
  prof.step();
  fake->launch(2);  // active: kept, and the kernel through correlation
  prof.step();
  fake->launch(3);  // after the schedule: dropped
  prof.stop();
  std::vector<std::string> names;
  for (const auto& a : prof.trace().activities) {
    if (a.type == ActivityType::Kernel || a.type == ActivityType::CudaRuntime) names.push_back(a.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"cudaLaunchKernel", "kernel_2"}));
  EXPECT_NE(prof.trace().collector_note.find("fake note"), std::string::npos);
}

TEST(Profiler, FailingCollectorIsNotedAndProfilingContinues) {
  Profiler prof(Schedule{.wait = 0, .warmup = 0, .active = 1, .repeat = 1});
  prof.add_collector(std::make_unique<FakeCollector>(true));
  prof.start();
  { RecordFunction r("still recorded"); }
  prof.step();
  prof.stop();
  const Trace& t = prof.trace();
  EXPECT_NE(t.collector_note.find("fake unavailable"), std::string::npos) << t.collector_note;
  EXPECT_NE(t.collector_note.find("no device here"), std::string::npos) << t.collector_note;
  const bool found = std::any_of(t.activities.begin(), t.activities.end(),
                                 [](const Activity& a) { return a.name == "still recorded"; });
  EXPECT_TRUE(found);
}

// A device collector that can flush (CUPTI's and the device-event one
// can): its records reach the profiler step by step, so that a long
// schedule folds them with their steps.
class FlushingCollector : public FakeCollector {
 public:
  FlushingCollector() : FakeCollector(false) {}
  bool can_flush() const override { return true; }
  void flush(std::vector<Activity>& out) override {
    ++flushes;
    drain(out);
  }
  void rewrite(Trace& trace) override { rewritten += static_cast<int>(trace.activities.size() > 0); }
  int flushes = 0;
  int rewritten = 0;
};

// Issue 57 item 2: with a device collector running, a long schedule's steps
// are folded too (before, every step's records stayed until stop()): each
// folded step arrives with its own launch and the kernel it caused, even one
// that ran after the step ended, the held events do not grow with the step
// count, and the collector rewrites each piece (graph replays) before it
// is folded.
TEST(Profiler, DeviceCollectorsStepsAreFoldedWithTheirDeviceWork) {
  constexpr int kKeep = 2;
  std::vector<std::size_t> peaks;
  for (const int steps : {20, 200}) {
    SCOPED_TRACE(steps);
    Profiler prof(Schedule{.wait = 0, .warmup = 0, .active = steps, .repeat = 1});
    auto owned = std::make_unique<FlushingCollector>();
    FlushingCollector* fake = owned.get();
    prof.add_collector(std::move(owned));
    int folded = 0;
    prof.fold_steps_beyond(kKeep, [&](Trace&& step) {
      std::vector<std::string> names;
      for (const Activity& a : step.activities) names.push_back(a.name);
      const std::string n = std::to_string(folded + 1);
      EXPECT_EQ(names, (std::vector<std::string>{"ProfilerStep#" + std::to_string(folded), "forward",
                                                 "cudaLaunchKernel", "kernel_" + n}));
      for (const Activity& a : step.activities) EXPECT_EQ(a.step, folded) << a.name;
      ++folded;
    });
    prof.start();
    EXPECT_TRUE(prof.folds_steps());
    for (int s = 0; s < steps; ++s) {
      {
        RecordFunction r("forward");
        fake->launch(static_cast<std::uint64_t>(s + 1));
      }
      prof.step();
    }
    prof.stop();
    EXPECT_EQ(folded, steps - kKeep);
    EXPECT_EQ(prof.trace().steps_folded, steps - kKeep);
    int kernels = 0;
    for (const Activity& a : prof.trace().activities) kernels += a.type == ActivityType::Kernel;
    EXPECT_EQ(kernels, kKeep) << "the kept steps' kernels, drained at stop()";
    EXPECT_GE(fake->flushes, steps - kKeep);
    EXPECT_EQ(fake->rewritten, steps - kKeep + 1) << "each folded step, then the kept trace";
    peaks.push_back(prof.peak_events());
  }
  ASSERT_EQ(peaks.size(), 2u);
  EXPECT_EQ(peaks[0], peaks[1]);
}

// A collector that cannot flush keeps every step whole, as before.
TEST(Profiler, ACollectorThatCannotFlushKeepsEveryStep) {
  Profiler prof(Schedule{.wait = 0, .warmup = 0, .active = 10, .repeat = 1});
  prof.add_collector(std::make_unique<FakeCollector>(false));
  int folded = 0;
  prof.fold_steps_beyond(2, [&](Trace&&) { ++folded; });
  prof.start();
  EXPECT_FALSE(prof.folds_steps());
  for (int s = 0; s < 10; ++s) prof.step();
  prof.stop();
  EXPECT_EQ(folded, 0);
  EXPECT_EQ(prof.trace().steps_recorded, 10);
}

}  // namespace
}  // namespace attnprof
