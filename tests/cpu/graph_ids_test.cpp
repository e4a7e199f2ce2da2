// analyze on CUDA graph traces whose ids are missing or wrong: PyTorch 2.11's
// Kineto with CUDA 13 writes no graph or node ids, so replays are read from
// their cudaGraphLaunch correlations (graph_numbering.cpp); and issue 59's
// bad input, probed: node ids that name no node, a replay missing a node or
// running one more, launches sharing a correlation or running nothing, a
// trace that ends inside a replay. Each is read as what it is, or said in one
// line; nothing is made up. The traces: tests/common/kineto_trace.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/report.h"
#include "attnprof/trace_reader.h"
#include "common/kineto_trace.h"
#include "graph_analysis_support.h"

namespace attnprof {
namespace {

using testing::analyze_spec;
using testing::expect_by_names;
using testing::kineto_graph_trace;
using testing::KinetoGraphSpec;
using testing::notes;
using testing::replays;

TEST(GraphReplays, WithoutGraphIdsReplaysAreReadFromTheirLaunches) {
  const TraceAnalysis with = analyze_spec(KinetoGraphSpec{});
  const TraceAnalysis a = analyze_spec(KinetoGraphSpec{.no_graph_ids = true});
  ASSERT_EQ(a.graph_notes.size(), 2u) << notes(a);
  EXPECT_NE(a.graph_notes[0].find("no graph or node ids"), std::string::npos) << notes(a);
  EXPECT_NE(a.graph_notes[0].find("3 replays read as the device work under each cudaGraphLaunch"), std::string::npos)
      << notes(a);
  EXPECT_NE(a.graph_notes[1].find("graph 1: 3 replays of 10 nodes, each node tied"), std::string::npos) << notes(a);
  ASSERT_EQ(replays(a).size(), replays(with).size());
  for (std::size_t k = 0; k < replays(a).size(); ++k) {
    const StepAnalysis& s = *replays(a)[k];
    const StepAnalysis& w = *replays(with)[k];
    EXPECT_EQ(s.label, w.label);
    EXPECT_EQ(s.kernels, w.kernels) << s.label;
    ASSERT_EQ(s.attention.calls.size(), w.attention.calls.size()) << s.label << "\n" << notes(a);
    for (std::size_t c = 0; c < s.attention.calls.size(); ++c) {
      EXPECT_EQ(s.attention.calls[c].found_by, "capture") << s.label;
      EXPECT_EQ(s.attention.calls[c].shape, w.attention.calls[c].shape) << s.label;
      EXPECT_EQ(s.attention.calls[c].backend, w.attention.calls[c].backend) << s.label;
    }
  }

  KinetoGraphSpec two;
  two.graphs = 2;
  two.no_graph_ids = true;
  const TraceAnalysis b = analyze_spec(two);
  ASSERT_EQ(b.graph_notes.size(), 2u) << notes(b);
  EXPECT_NE(b.graph_notes[1].find("graph 1: 6 replays of 10 nodes, but 2 captures in the trace launched the same "
                                  "sequence as 1 replayed graphs"),
            std::string::npos)
      << notes(b);
  for (const StepAnalysis* s : replays(b)) {
    ASSERT_EQ(s->attention.calls.size(), 2u) << s->label;
    for (const AttentionCall& c : s->attention.calls) {
      EXPECT_EQ(c.found_by, "kernel names") << s->label;
      EXPECT_TRUE(c.shape.empty()) << s->label << ": " << c.shape;  // never a shape made up
    }
  }
}

// Issue 59's bad input, probed: node ids that name no node (every replayed
// activity under one id, or under none, while the graph id is there) must not
// put a replay's GEMMs into its first attention call, nor say the graph holds
// no attention. Its work is numbered in start order, as a trace without ids is.
TEST(GraphReplays, NodeIdsThatNameNoNodeAreNumberedInStartOrder) {
  // 2^64 - 1: a node id of -1 as the reader keeps it; the new ids must not wrap to 0 past it.
  for (const std::uint64_t id : {std::uint64_t{7}, std::uint64_t{0}, ~std::uint64_t{0}}) {
    Trace t = parse_chrome_trace(kineto_graph_trace({}), "graph.json");
    for (Activity& x : t.activities) {
      if (x.graph_id != 0) x.graph_node_id = id;
    }
    const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
    const std::string n = notes(a);
    SCOPED_TRACE("node id " + std::to_string(id) + "\n" + n);
    EXPECT_NE(n.find("graph 1: its node ids name no node"), std::string::npos);
    EXPECT_EQ(n.find("holds no attention"), std::string::npos);
    ASSERT_EQ(replays(a).size(), 3u);
    for (const StepAnalysis* s : replays(a)) {
      ASSERT_EQ(s->attention.calls.size(), 2u) << s->label;
      for (const AttentionCall& c : s->attention.calls) {
        EXPECT_EQ(c.found_by, "capture") << s->label << ": numbered, the nodes tie to the capture";
        EXPECT_EQ(c.kernels.size(), 2u) << s->label;
        EXPECT_DOUBLE_EQ(c.gpu_us, 22) << s->label;
        for (const std::string& k : c.kernels) EXPECT_EQ(k.find("nvjet"), std::string::npos) << s->label;
      }
    }
  }
}

// A replay that lost a node (a dropped record, a trace that ends inside it):
// the call missing a kernel has no FLOP rate (its captured FLOPs over part of
// its time would be made up), and the graph's line says which replay.
TEST(GraphReplays, AReplayMissingANodeGivesThatCallNoRate) {
  Trace t = parse_chrome_trace(kineto_graph_trace({}), "graph.json");
  int seen = 0;
  const auto split = std::find_if(t.activities.begin(), t.activities.end(), [&](const Activity& x) {
    return x.graph_id == 1 && x.name.find("flash_fwd_splitkv_kernel") != std::string::npos && ++seen == 3;
  });
  ASSERT_NE(split, t.activities.end());
  t.activities.erase(split);  // replay 2's first split kernel
  const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
  const std::string n = notes(a);
  EXPECT_NE(n.find("replay 2 ran 9 of its 10 nodes"), std::string::npos) << n;
  ASSERT_EQ(replays(a).size(), 3u);
  const StepAnalysis& r2 = *replays(a)[1];
  ASSERT_EQ(r2.label, "graph 1 replay 2");
  ASSERT_EQ(r2.attention.calls.size(), 2u);
  EXPECT_EQ(r2.attention.calls[0].kernels.size(), 1u);
  EXPECT_FALSE(r2.attention.calls[0].tflops) << "captured FLOPs over the combine's 2 us alone";
  EXPECT_FALSE(r2.attention.calls[0].gbs);
  EXPECT_EQ(r2.attention.calls[0].shape, "1x8x1x128, kv 1x8x4096x128") << "the shape is the capture's still";
  EXPECT_TRUE(r2.attention.calls[1].tflops);
  for (const std::size_t k : {std::size_t{0}, std::size_t{2}}) {
    for (const AttentionCall& c : replays(a)[k]->attention.calls) EXPECT_TRUE(c.tflops) << replays(a)[k]->label;
  }
}

// Two cudaGraphLaunch calls with one correlation id (a merged or corrupt
// trace): their work cannot be told apart, one replay, and the count of
// replays read agrees with the graphs' lines.
TEST(GraphReplays, LaunchesSharingACorrelationAreOneReplayCountedOnce) {
  Trace t = parse_chrome_trace(kineto_graph_trace({.no_graph_ids = true}), "graph.json");
  std::vector<std::uint64_t> launch;
  for (const Activity& x : t.activities) {
    if (x.name == "cudaGraphLaunch") launch.push_back(x.correlation);
  }
  ASSERT_EQ(launch.size(), 3u);
  for (Activity& x : t.activities) {
    if (x.correlation == launch[2]) x.correlation = launch[1];
  }
  const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
  const std::string n = notes(a);
  EXPECT_NE(n.find(": 2 replays read as the device work"), std::string::npos) << n;
  EXPECT_NE(n.find("graph 1: 1 replay of 10 nodes"), std::string::npos) << n;
  EXPECT_NE(n.find("graph 2: 1 replay of 20 nodes"), std::string::npos) << n;
}

// A trace without ids that ends inside its last replay (Kineto's buffer full,
// the profiler stopped): that replay ran the first nodes of its graph, and is
// read as a short replay of it, not as another graph whose capture "the
// profiler was off" for. Its call missing a kernel has no rate.
TEST(GraphReplays, ATraceEndingInsideItsLastReplayReadsAShortReplay) {
  Trace t = parse_chrome_trace(kineto_graph_trace({.no_graph_ids = true}), "graph.json");
  std::uint64_t last = 0;
  for (const Activity& x : t.activities) {
    if (x.name == "cudaGraphLaunch") last = x.correlation;
  }
  int kept = 0;
  std::erase_if(t.activities, [&](const Activity& x) {
    return x.on_device() && x.correlation == last && ++kept > 3;  // its mm, memset and split kernel ran
  });
  const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
  const std::string n = notes(a);
  EXPECT_NE(n.find("graph 1: 3 replays of 10 nodes, each node tied"), std::string::npos) << n;
  EXPECT_NE(n.find("replay 3 ran 3 of its 10 nodes"), std::string::npos) << n;
  EXPECT_EQ(n.find("graph 2"), std::string::npos) << n;
  ASSERT_EQ(replays(a).size(), 3u) << n;
  const StepAnalysis& r3 = *replays(a)[2];
  EXPECT_EQ(r3.label, "graph 1 replay 3");
  ASSERT_EQ(r3.attention.calls.size(), 1u) << n;
  EXPECT_EQ(r3.attention.calls[0].found_by, "capture");
  EXPECT_FALSE(r3.attention.calls[0].tflops) << "its combine never ran";
}

// A graph launch whose correlation id matches no device work (the profiler
// stopped before its work ran, or CUPTI dropped the records) is said in one
// line, counted once, and makes no replay; a driver cuGraphLaunch inside the
// runtime's cudaGraphLaunch is that launch, not a second one.
TEST(GraphReplays, LaunchesThatRanNoRecordedWorkAreOneLine) {
  for (const bool ids : {true, false}) {
    SCOPED_TRACE(ids ? "with graph ids" : "without graph ids");
    Trace t = parse_chrome_trace(kineto_graph_trace({.no_graph_ids = !ids}), "graph.json");
    std::vector<Activity> launch;
    std::uint64_t top = 0;
    for (const Activity& x : t.activities) {
      if (x.name == "cudaGraphLaunch") launch.push_back(x);
      top = std::max(top, x.correlation);
    }
    ASSERT_EQ(launch.size(), 3u);
    // Replay 2's work is gone; a driver launch with its own correlation ran none either.
    std::erase_if(t.activities,
                  [&](const Activity& x) { return x.on_device() && x.correlation == launch[1].correlation; });
    Activity driver = launch[2];
    driver.type = ActivityType::CudaDriver;
    driver.name = "cuGraphLaunch";
    driver.correlation = ++top;
    driver.start_ns += 20'000;
    t.activities.push_back(driver);
    // The runtime's own driver call, nested in replay 3's launch: no second launch.
    Activity nested = launch[2];
    nested.type = ActivityType::CudaDriver;
    nested.name = "cuGraphLaunch";
    nested.correlation = ++top;
    nested.start_ns += 1'000;
    nested.dur_ns = 2'000;
    t.activities.push_back(nested);
    const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
    const std::string n = notes(a);
    int lines = 0;
    for (const std::string& line : a.graph_notes) {
      lines += line.find("graph launches ran no device work the trace recorded") != std::string::npos;
    }
    EXPECT_EQ(lines, 1) << n;
    EXPECT_NE(n.find("2 graph launches ran no device work the trace recorded (the profiler stopped, or CUPTI "
                     "dropped them)"),
              std::string::npos)
        << n;
    EXPECT_NE(n.find("graph 1: 2 replays of 10 nodes, each node tied"), std::string::npos) << n;
    ASSERT_EQ(replays(a).size(), 2u) << "no replay made up for the launches that ran nothing\n" << n;
    EXPECT_NE(analysis_text(a).find("2 graph launches ran no device work"), std::string::npos) << "the report says it";
  }
  // Every launch empty: the line alone, no graph, no replay.
  Trace t = parse_chrome_trace(kineto_graph_trace({}), "graph.json");
  std::erase_if(t.activities, [](const Activity& x) { return x.on_device() && x.graph_id != 0; });
  const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
  ASSERT_EQ(a.graph_notes.size(), 1u) << notes(a);
  EXPECT_NE(a.graph_notes[0].find("3 graph launches ran no device work the trace recorded"), std::string::npos)
      << notes(a);
  EXPECT_TRUE(replays(a).empty());
  // Without ids, a launch after a trace's short last replay (the profiler
  // stopped) leaves that replay the last one that ran: a short replay of its
  // graph, not a graph of its own.
  {
    Trace t = parse_chrome_trace(kineto_graph_trace({.no_graph_ids = true}), "graph.json");
    const auto launch = std::find_if(t.activities.rbegin(), t.activities.rend(),
                                     [](const Activity& x) { return x.name == "cudaGraphLaunch"; });
    ASSERT_NE(launch, t.activities.rend());
    Activity after = *launch;
    int kept = 0;
    std::erase_if(t.activities,
                  [&](const Activity& x) { return x.on_device() && x.correlation == after.correlation && ++kept > 3; });
    after.correlation = 1'000'000;
    after.start_ns += 50'000;
    t.activities.push_back(after);
    const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
    const std::string n = notes(a);
    EXPECT_NE(n.find("replay 3 ran 3 of its 10 nodes"), std::string::npos) << n;
    EXPECT_EQ(n.find("graph 2"), std::string::npos) << n;
    EXPECT_NE(n.find("1 graph launch ran no device work the trace recorded (the profiler stopped, or CUPTI dropped "
                     "it)"),
              std::string::npos)
        << n;
  }
  // A trace with no graph launch says nothing of graphs.
  EXPECT_TRUE(analyze_spec(KinetoGraphSpec{.eager = true}).graph_notes.empty());
}

// A replay that ran a node its graph's other replays did not (one more
// device activity, with ids): the replays disagree, and the line says so,
// not that the profiler was off during capture; no tie is claimed.
TEST(GraphReplays, AReplayWithAnExtraNodeSaysTheReplaysDisagree) {
  Trace t = parse_chrome_trace(kineto_graph_trace({}), "graph.json");
  std::vector<std::uint64_t> launch;
  for (const Activity& x : t.activities) {
    if (x.name == "cudaGraphLaunch") launch.push_back(x.correlation);
  }
  ASSERT_EQ(launch.size(), 3u);
  // Replay 2 ran one more product, as node 1010, after its last node.
  const auto last = std::find_if(t.activities.rbegin(), t.activities.rend(), [&](const Activity& x) {
    return x.type == ActivityType::Kernel && x.correlation == launch[1];
  });
  ASSERT_NE(last, t.activities.rend());
  Activity extra = *last;
  ASSERT_EQ(extra.graph_node_id, 1009u);
  extra.graph_node_id = 1010;
  extra.start_ns = last->end_ns() + 500;
  t.activities.push_back(extra);
  const TraceAnalysis a = analyze_trace(std::move(t), "graph.json");
  const std::string n = notes(a);
  ASSERT_EQ(a.graph_notes.size(), 1u) << n;
  EXPECT_EQ(n.find("profiler was off"), std::string::npos) << n;
  EXPECT_NE(n.find("graph 1: 3 replays, but its replays disagree: replay 2 ran 11 nodes where the others ran 10 "
                   "(node 1010 is in 1 of its 3 replays)"),
            std::string::npos)
      << n;
  EXPECT_NE(n.find("not tied to a capture; attention found by kernel names only, without shapes"), std::string::npos)
      << n;
  EXPECT_EQ(n.find("each node tied"), std::string::npos) << n;
  EXPECT_EQ(n.find("of its 11 nodes"), std::string::npos) << "the others lost nothing\n" << n;
  expect_by_names(a, 2);
}

}  // namespace
}  // namespace attnprof
