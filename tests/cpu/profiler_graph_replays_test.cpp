// CUDA graph replays in attnprof's own profile (issue 59 item 1), on
// synthetic CUPTI-shaped records: graph nodes mapped to the ranges they were
// captured in (clone chains included), and each replay rewritten so that
// key averages, the analysis and the Chrome trace count N replays of a
// captured call as N calls with their kernels, as eager calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/key_averages.h"
#include "attnprof/trace_io.h"
#include "profiler/graph_replays.h"

namespace attnprof {
namespace {

constexpr std::int64_t kPid = 11;
constexpr std::int64_t kTid = 12;
constexpr std::uint32_t kGraph = 6;

Activity host(ActivityType type, const std::string& name, std::int64_t start, std::int64_t dur, int depth,
              std::uint64_t external_id, std::int64_t step) {
  Activity a;
  a.type = type;
  a.name = name;
  a.start_ns = start;
  a.dur_ns = dur;
  a.pid = kPid;
  a.tid = kTid;
  a.depth = depth;
  a.external_id = external_id;
  a.step = step;
  return a;
}

Activity launch(const std::string& name, std::int64_t start, std::int64_t dur, int depth, std::uint64_t correlation,
                std::uint64_t external_id, std::int64_t step) {
  Activity a = host(ActivityType::CudaRuntime, name, start, dur, depth, external_id, step);
  a.correlation = correlation;
  return a;
}

Activity kernel(const std::string& name, std::int64_t start, std::int64_t dur, std::uint64_t correlation,
                std::uint64_t node, std::uint64_t external_id) {
  Activity a;
  a.type = ActivityType::Kernel;
  a.name = name;
  a.start_ns = start;
  a.dur_ns = dur;
  a.device = 0;
  a.stream = 7;
  a.pid = 0;
  a.tid = 7;
  a.correlation = correlation;
  a.external_id = external_id;
  a.graph_id = node ? kGraph : 0;
  a.graph_node_id = node;
  a.kernel = KernelInfo{};
  return a;
}

// Step 0 captures two attention calls into one graph (the second with an op
// inside, and a kernel of its own), plus a node made with only the step's
// range open; the graph is instantiated (every node cloned). Steps
// 1..replays replay it. With `outer`, a range ("generate") is open over the
// capture and every replay.
struct Scenario {
  GraphCaptures captures;
  Trace capture_step;
  Trace replay_steps;
  int replays = 3;

  explicit Scenario(bool outer = false) {
    std::vector<Activity>& c = capture_step.activities;
    c.push_back(host(ActivityType::UserAnnotation, "ProfilerStep#0", 0, 10000, 0, 1, 0));
    std::vector<std::uint64_t> open{1};
    if (outer) {
      c.push_back(host(ActivityType::UserAnnotation, "generate", 50, 10000 * (replays + 1), 1, 5, 0));
      open.push_back(5);
    }
    const auto created = [&](std::uint64_t node, std::initializer_list<std::uint64_t> inner) {
      std::vector<std::uint64_t> all = open;
      all.insert(all.end(), inner.begin(), inner.end());
      captures.node_created(node, all);
    };
    Activity fwd = host(ActivityType::UserAnnotation, "forward", 1000, 1000, 1, 10, 0);
    fwd.input_dtypes = "bf16, bf16, bf16";
    fwd.input_dims = "[1, 8, 1, 64], [1, 8, 256, 64], [1, 8, 256, 64]";
    c.push_back(fwd);
    c.push_back(launch("cudaLaunchKernel", 1100, 100, 2, 1, 10, 0));
    created(100, {10});
    fwd.external_id = 20;
    fwd.start_ns = 3000;
    c.push_back(fwd);
    c.push_back(host(ActivityType::CpuOp, "matmul", 3100, 400, 2, 21, 0));
    c.push_back(launch("cudaLaunchKernel", 3200, 100, 3, 2, 21, 0));
    created(200, {20, 21});
    c.push_back(launch("cudaLaunchKernel", 3600, 100, 2, 3, 20, 0));
    created(300, {20});
    c.push_back(launch("cudaLaunchKernel", 5000, 100, 1, 4, 1, 0));
    created(400, {});
    c.push_back(launch("cudaGraphInstantiate", 6000, 500, 1, 5, 1, 0));
    for (const std::uint64_t node : {100, 200, 300, 400}) captures.node_cloned(node, node + 1000);

    std::vector<Activity>& r = replay_steps.activities;
    for (int k = 1; k <= replays; ++k) {
      const std::int64_t t = 10000 * k;
      const std::uint64_t corr = 50 + static_cast<std::uint64_t>(k);
      const std::uint64_t ext = 2000 + static_cast<std::uint64_t>(k);
      r.push_back(host(ActivityType::UserAnnotation, "ProfilerStep#" + std::to_string(k), t, 9000, 0, 1000 + k, k));
      r.push_back(host(ActivityType::CpuOp, "replay", t + 100, 5000, 1, ext, k));
      r.push_back(launch("cudaGraphLaunch", t + 200, 3000, 2, corr, ext, k));
      r.push_back(kernel("attention_a", t + 4000, 100, corr, 1100, ext));
      r.push_back(kernel("gemm", t + 4200, 200, corr, 1200, ext));
      r.push_back(kernel("attention_b", t + 4500, 300, corr, 1300, ext));
      r.push_back(kernel("user_kernel", t + 4900, 400, corr, 1400, ext));
    }
  }

  Trace whole() const {
    Trace t = capture_step;
    t.activities.insert(t.activities.end(), replay_steps.activities.begin(), replay_steps.activities.end());
    return t;
  }
};

const KeyAverage* row(const std::vector<KeyAverage>& rows, const std::string& name) {
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const KeyAverage& r) { return r.name == name; });
  return it == rows.end() ? nullptr : &*it;
}

TEST(GraphCaptures, NodesMapToTheRangesOpenAtTheirCreationThroughClones) {
  Scenario s;
  ASSERT_NE(s.captures.ranges_of(100), nullptr);
  EXPECT_EQ(*s.captures.ranges_of(100), (std::vector<std::uint64_t>{1, 10}));
  EXPECT_EQ(*s.captures.ranges_of(1200), (std::vector<std::uint64_t>{1, 20, 21}));
  EXPECT_EQ(*s.captures.ranges_of(1300), (std::vector<std::uint64_t>{1, 20}));
  EXPECT_EQ(*s.captures.ranges_of(1400), (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(s.captures.ranges_of(9999), nullptr);
  // A clone of a clone (a graph cloned, then instantiated) reaches the capture.
  s.captures.node_cloned(1200, 2200);
  ASSERT_NE(s.captures.ranges_of(2200), nullptr);
  EXPECT_EQ(*s.captures.ranges_of(2200), (std::vector<std::uint64_t>{1, 20, 21}));
  s.captures.node_cloned(12345, 3000);  // an original never seen: nothing
  EXPECT_EQ(s.captures.ranges_of(3000), nullptr);
  s.captures.clear();
  EXPECT_EQ(s.captures.ranges_of(100), nullptr);
  EXPECT_EQ(s.captures.nodes(), 0u);
}

// Without the rewrite, the two captured calls are two calls with no device
// time and every replayed kernel is the replay op's: what a profiler that
// knows no graph shows (and attnprof's did).
TEST(GraphReplays, KeyAveragesCountEachReplayedCallWithItsKernels) {
  Scenario s;
  Trace before = s.whole();
  const std::vector<KeyAverage> unattributed = key_averages(before);
  ASSERT_NE(row(unattributed, "forward"), nullptr);
  EXPECT_EQ(row(unattributed, "forward")->count, 2);
  EXPECT_EQ(row(unattributed, "forward")->cuda_total_ns, 0);

  Trace t = s.whole();
  EXPECT_EQ(s.captures.attribute(t), static_cast<std::size_t>(2 * s.replays));
  const std::vector<KeyAverage> rows = key_averages(t);
  const KeyAverage* forward = row(rows, "forward");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->count, 2 * s.replays);
  EXPECT_EQ(forward->cuda_total_ns, s.replays * (100 + 200 + 300));
  EXPECT_EQ(forward->self_cuda_ns, s.replays * (100 + 300)) << "gemm is matmul's";
  const KeyAverage* matmul = row(rows, "matmul");
  ASSERT_NE(matmul, nullptr);
  EXPECT_EQ(matmul->count, s.replays);
  EXPECT_EQ(matmul->self_cuda_ns, s.replays * 200);
  // The capture's own ranges: one call each, that ran nothing.
  ASSERT_NE(row(rows, "forward (graph capture)"), nullptr);
  EXPECT_EQ(row(rows, "forward (graph capture)")->count, 2);
  EXPECT_EQ(row(rows, "forward (graph capture)")->cuda_total_ns, 0);
  EXPECT_EQ(row(rows, "matmul (graph capture)")->count, 1);
  // The replay op holds it all, and alone the kernel no captured call claims.
  const KeyAverage* replay = row(rows, "replay");
  ASSERT_NE(replay, nullptr);
  EXPECT_EQ(replay->count, s.replays);
  EXPECT_EQ(replay->cuda_total_ns, s.replays * 1000);
  EXPECT_EQ(replay->self_cuda_ns, s.replays * 400);
  // The launch call is cut into one slice per range that launched captured
  // work (the first forward, the second, its matmul) and one for the rest:
  // its host time is kept whole.
  const KeyAverage* graph_launch = row(rows, "cudaGraphLaunch");
  ASSERT_NE(graph_launch, nullptr);
  EXPECT_EQ(graph_launch->count, 4 * s.replays);
  EXPECT_EQ(graph_launch->cpu_total_ns, 3000 * s.replays);
  // Every device activity is still there, once.
  EXPECT_EQ(row(rows, "attention_a")->count, s.replays);
  EXPECT_EQ(row(rows, "user_kernel")->count, s.replays);
}

TEST(GraphReplays, TheAnalysisSeesOneForwardPerReplayedCall) {
  Scenario s;
  Trace t = s.whole();
  s.captures.attribute(t);
  const analysis::TraceIndex index(t);
  ASSERT_EQ(index.call_scope(), analysis::TraceIndex::CallScope::Forward);
  ASSERT_EQ(index.forwards().size(), static_cast<std::size_t>(2 * s.replays));
  for (std::size_t f = 0; f < index.forwards().size(); ++f) {
    std::multiset<std::string> kernels;
    for (const analysis::EventIndex d : index.forward_device(f)) kernels.insert(index.at(d).name);
    const auto want =
        f % 2 == 0 ? std::multiset<std::string>{"attention_a"} : std::multiset<std::string>{"gemm", "attention_b"};
    EXPECT_EQ(kernels, want) << "call " << f;
    EXPECT_EQ(index.at(index.forwards()[f]).input_dims, "[1, 8, 1, 64], [1, 8, 256, 64], [1, 8, 256, 64]");
  }
}

TEST(GraphReplays, ChromeTraceCarriesGraphIdsAndLinksKernelsToTheirCall) {
  Scenario s;
  Trace t = s.whole();
  t.activities.push_back(kernel("eager", 90000, 10, 0, 0, 0));
  s.captures.attribute(t);
  const nlohmann::json doc = nlohmann::json::parse(chrome_trace_json(t));
  std::map<std::uint64_t, std::string> calls;  // External id -> name, of host ranges
  std::set<std::uint64_t> flow_starts;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") == "s") flow_starts.insert(e["id"].get<std::uint64_t>());
    if (e.value("cat", "") == "user_annotation" || e.value("cat", "") == "cpu_op")
      calls[e["args"]["External id"].get<std::uint64_t>()] = e["name"].get<std::string>();
  }
  int graph_kernels = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("cat", "") != "kernel") continue;
    const auto& args = e["args"];
    if (e["name"] == "eager") {
      EXPECT_FALSE(args.contains("graph id"));
      EXPECT_FALSE(args.contains("graph node id"));
      continue;
    }
    ++graph_kernels;
    EXPECT_EQ(args["graph id"].get<std::uint32_t>(), kGraph);
    EXPECT_GE(args["graph node id"].get<std::uint64_t>(), 1100u);
    EXPECT_TRUE(flow_starts.contains(args["correlation"].get<std::uint64_t>())) << e["name"].get<std::string>();
    const std::string owner = calls[args["External id"].get<std::uint64_t>()];
    const std::string name = e["name"].get<std::string>();
    const std::string want = name == "gemm" ? "matmul" : name == "user_kernel" ? "replay" : "forward";
    EXPECT_EQ(owner, want) << name;
  }
  EXPECT_EQ(graph_kernels, 4 * s.replays);
}

// A long schedule folds each step alone: the capture's step first, its
// replays later, still tied to it.
TEST(GraphReplays, AReplayInALaterStepThanItsCaptureStillFindsIt) {
  Scenario s;
  Trace capture = s.capture_step;
  EXPECT_EQ(s.captures.attribute(capture), 0u);
  Trace replays = s.replay_steps;
  EXPECT_EQ(s.captures.attribute(replays), static_cast<std::size_t>(2 * s.replays));
  EXPECT_EQ(row(key_averages(replays), "forward")->count, 2 * s.replays);
  EXPECT_EQ(row(key_averages(capture), "forward (graph capture)")->count, 2);
}

// A range open over the capture and every replay (a caller's "generate")
// is around each replay already: not copied into it, and not renamed.
TEST(GraphReplays, ARangeOpenAroundTheReplaysIsNotCopiedIntoThem) {
  Scenario s(/*outer=*/true);
  Trace t = s.whole();
  EXPECT_EQ(s.captures.attribute(t), static_cast<std::size_t>(2 * s.replays));
  const std::vector<KeyAverage> rows = key_averages(t);
  ASSERT_NE(row(rows, "generate"), nullptr);
  EXPECT_EQ(row(rows, "generate")->count, 1);
  EXPECT_EQ(row(rows, "generate (graph capture)"), nullptr);
  EXPECT_EQ(row(rows, "forward")->count, 2 * s.replays);
  EXPECT_EQ(row(rows, "forward")->cuda_total_ns, s.replays * (100 + 200 + 300));
}

// Nothing invented: replays of a graph captured outside the recorded steps
// (its ranges unknown) stay on their launch, as before.
TEST(GraphReplays, ACaptureNeverRecordedLeavesReplaysAsTheyWere) {
  Scenario s;
  Trace replays = s.replay_steps;
  EXPECT_EQ(s.captures.attribute(replays), 0u);
  const std::vector<KeyAverage> rows = key_averages(replays);
  EXPECT_EQ(row(rows, "forward"), nullptr);
  EXPECT_EQ(row(rows, "cudaGraphLaunch")->count, s.replays);
  EXPECT_EQ(row(rows, "replay")->self_cuda_ns, s.replays * 1000);
}

}  // namespace
}  // namespace attnprof
