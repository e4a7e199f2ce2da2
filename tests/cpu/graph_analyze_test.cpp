// analyze on traces of CUDA graph replays, built in the exact format Kineto
// writes (tests/common/kineto_trace.h's kineto_graph_trace): each replay a
// step, its attention calls tied to the ops captured into the graph (shapes,
// backend, FLOPs, bytes), nothing put under another op; and each way the tie
// is refused (no capture, captures that cannot be told apart, node ids
// repeated across graphs, a node that does not match its launch, a graph
// without attention) said in one line, with attention then counted by kernel
// names and no shape made up. Traces whose ids are missing or name no node
// (as PyTorch 2.11's are): graph_ids_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/error.h"
#include "attnprof/replay.h"
#include "attnprof/report.h"
#include "attnprof/trace_reader.h"
#include "common/kineto_trace.h"
#include "findings_lookup.h"
#include "graph_analysis_support.h"

namespace attnprof {
namespace {

using testing::analyze_spec;
using testing::by_rule;
using testing::dump;
using testing::expect_by_names;
using testing::kineto_graph_trace;
using testing::KinetoGraphSpec;
using testing::notes;
using testing::op_row;
using testing::replays;

TEST(GraphReplays, EachReplayIsAStepWithItsLayersAttentionTiedToTheCapture) {
  const KinetoGraphSpec spec;  // 1 graph, 2 layers, 3 replays, each in a ProfilerStep with an eager argmax
  const TraceAnalysis a = analyze_spec(spec);
  ASSERT_EQ(a.steps.size(), 6u) << analysis_text(a);
  EXPECT_EQ(a.steps[0].label, "ProfilerStep#1");
  EXPECT_EQ(a.steps[1].label, "graph 1 replay 1");
  EXPECT_EQ(a.steps[1].launched_in, "ProfilerStep#1");
  EXPECT_EQ(a.steps[5].label, "graph 1 replay 3");
  ASSERT_EQ(a.graph_notes.size(), 1u);
  EXPECT_NE(a.graph_notes[0].find("graph 1: 3 replays of 10 nodes, each node tied"), std::string::npos) << notes(a);
  EXPECT_NE(a.graph_notes[0].find("2 attention calls a replay, shapes from the capture"), std::string::npos);

  int calls = 0;
  for (const StepAnalysis* s : replays(a)) {
    EXPECT_EQ(s->kernels, 8);  // per layer: two products, the split kernel and its combine
    EXPECT_EQ(s->memsets, 2);
    ASSERT_EQ(s->attention.calls.size(), 2u) << s->label << ": one call per layer";
    for (const AttentionCall& c : s->attention.calls) {
      ++calls;
      EXPECT_EQ(c.graph_id, 1u);
      EXPECT_EQ(c.found_by, "capture");
      EXPECT_EQ(c.op, "aten::scaled_dot_product_attention");
      EXPECT_EQ(c.backend, "flash");
      EXPECT_EQ(c.shape, "1x8x1x128, kv 1x8x4096x128");
      EXPECT_EQ(c.mask, "none");
      EXPECT_EQ(c.dtype, "bf16");
      ASSERT_EQ(c.kernels.size(), 2u);
      EXPECT_NE(c.kernels[0].find("flash_fwd_splitkv_kernel"), std::string::npos);
      EXPECT_NE(c.kernels[1].find("splitkv_combine"), std::string::npos);
      EXPECT_DOUBLE_EQ(c.gpu_us, 22);
      // FLOPs and bytes of the captured shapes: 4 B H S Skv D; Q, K, V and O in bf16.
      ASSERT_TRUE(c.flops && c.bytes && c.gbs);
      EXPECT_DOUBLE_EQ(*c.flops, 4.0 * 8 * 1 * 4096 * 128);
      EXPECT_DOUBLE_EQ(*c.bytes, 2.0 * (8 * 128 + 2 * 8 * 4096 * 128 + 8 * 128));
      EXPECT_NEAR(*c.gbs, *c.bytes / 22e-6 / 1e9, 1e-9 * *c.gbs);
      ASSERT_TRUE(c.share_pct);
      EXPECT_NEAR(*c.share_pct, 100.0 * 22 / 64, 1e-9) << "of the replay's kernel time: 2 x (5 + 20 + 2 + 5) us";
    }
    EXPECT_EQ(s->attention.calls[0].layer, 1);
    EXPECT_EQ(s->attention.calls[1].layer, 2);
    // Nothing under another op: every replayed node under the op that captured it.
    const OpRow* attention = op_row(*s, "aten::scaled_dot_product_attention");
    ASSERT_TRUE(attention) << analysis_text(a);
    EXPECT_EQ(attention->kernels, 4);
    ASSERT_TRUE(op_row(*s, "aten::mm"));
    EXPECT_EQ(op_row(*s, "aten::mm")->kernels, 4);
    ASSERT_TRUE(op_row(*s, "aten::fill_"));
    EXPECT_EQ(op_row(*s, "aten::fill_")->memsets, 2);
    EXPECT_FALSE(op_row(*s, "(no op)"));
    EXPECT_FALSE(op_row(*s, "(CUDA graph 1)"));
  }
  EXPECT_EQ(calls, spec.layers * spec.replays) << "count = layers x steps";
  // The captured ops ran nothing: no host step counts them as calls.
  for (const auto& s : a.steps) {
    if (s.graph_id == 0) {
      EXPECT_TRUE(s.attention.calls.empty()) << s.label;
    }
  }
}

TEST(GraphReplays, DecodeBelowTheBandwidthRoofIsAFindingNamingTheLayers) {
  const TraceAnalysis a = analyze_spec({});
  const StepAnalysis& s = a.steps[1];
  const Finding* f = by_rule(s.result.findings, "graph-attention-roof");
  ASSERT_TRUE(f) << dump(s.result.findings);
  EXPECT_EQ(f->severity, Severity::Warning);
  // 16.8 MB in 22 us: 763 GB/s of the H100 SXM's 3350 GB/s.
  EXPECT_NE(f->text.find("graph 1, layers 1-2: decode attention (flash, 1x8x1x128, kv 1x8x4096x128 none bf16) at "
                         "23% of the HBM bandwidth (763 GB/s of 3350 GB/s, the H100 SXM's datasheet peak), below 50%"),
            std::string::npos)
      << f->text;
  EXPECT_NE(f->text.find("its 8 CTAs leave 124 of the 132 SMs idle: a split-KV decode kernel"), std::string::npos)
      << f->text;
  const Finding* problems = by_rule(s.result.findings, "attention-problems");
  ASSERT_TRUE(problems);
  EXPECT_NE(problems->text.find("attention: 2 flash forward calls per replay"), std::string::npos) << problems->text;
  // The replay's host time is its launch's, not the span to its last kernel: no CPU-bound verdict.
  EXPECT_DOUBLE_EQ(s.result.metrics.host_time_us, 8);
  for (const StepAnalysis* r : replays(a)) EXPECT_FALSE(by_rule(r->result.findings, "cpu-bound")) << r->label;
  // A given bandwidth is read instead of the datasheet's.
  AnalyzeOptions o;
  o.memory_gbs = 2000;
  const TraceAnalysis given = analyze_trace(parse_chrome_trace(kineto_graph_trace({}), "graph.json"), "graph.json", o);
  const Finding* g = by_rule(given.steps[1].result.findings, "graph-attention-roof");
  ASSERT_TRUE(g) << dump(given.steps[1].result.findings);
  EXPECT_NE(g->text.find("at 38% of the HBM bandwidth (763 GB/s of 2000 GB/s, the given bandwidth)"), std::string::npos)
      << g->text;
  // Fast enough: no finding.
  KinetoGraphSpec fast;
  fast.attention_us = 4;
  const TraceAnalysis quick = analyze_spec(fast);
  EXPECT_FALSE(by_rule(quick.steps[1].result.findings, "graph-attention-roof")) << dump(quick.steps[1].result.findings);
}

TEST(GraphReplays, AttnprofsOpAndKernelsNameTheBackend) {
  KinetoGraphSpec spec;
  spec.attnprof = true;
  const TraceAnalysis a = analyze_spec(spec);
  for (const StepAnalysis* s : replays(a)) {
    ASSERT_EQ(s->attention.calls.size(), 2u) << analysis_text(a);
    for (const AttentionCall& c : s->attention.calls) {
      EXPECT_EQ(c.op, "attnprof::attention");
      EXPECT_EQ(c.backend, "attnprof:flash");
      EXPECT_EQ(c.mask, "none") << "the Python front end's label at capture";
      EXPECT_TRUE(c.flops);
    }
    EXPECT_TRUE(op_row(*s, "attnprof::attention"));
  }
}

TEST(GraphReplays, AttentionStaysUnderItsOpInsideACompiledFunction) {
  KinetoGraphSpec spec;
  spec.compiled = true;
  const TraceAnalysis a = analyze_spec(spec);
  for (const StepAnalysis* s : replays(a)) {
    ASSERT_EQ(s->attention.calls.size(), 2u) << analysis_text(a);
    const OpRow* attention = op_row(*s, "aten::scaled_dot_product_attention");
    ASSERT_TRUE(attention) << analysis_text(a);
    EXPECT_EQ(attention->kernels, 4);
    EXPECT_EQ(attention->calls, 2);
    const OpRow* compiled = op_row(*s, "CompiledFunction");
    ASSERT_TRUE(compiled);
    EXPECT_EQ(compiled->kernels, 4) << "the products, under the op that enclosed them at capture";
    EXPECT_EQ(compiled->memsets, 2);
    EXPECT_EQ(compiled->calls, 1);
  }
}

TEST(GraphReplays, TwoGraphsEachTiedToItsOwnCapture) {
  KinetoGraphSpec spec;
  spec.graphs = 2;
  const TraceAnalysis a = analyze_spec(spec);
  ASSERT_EQ(a.graph_notes.size(), 2u);
  int seen = 0;
  for (const StepAnalysis* s : replays(a)) {
    ASSERT_EQ(s->attention.calls.size(), 2u);
    const std::string batch = std::to_string(s->graph_id);
    for (const AttentionCall& c : s->attention.calls) {
      EXPECT_EQ(c.shape, batch + "x8x1x128, kv " + batch + "x8x4096x128") << s->label;
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2 * 2 * 3);
}

TEST(GraphReplays, NoCaptureInTheTraceIsOneLineAndKernelNamesCount) {
  KinetoGraphSpec spec;
  spec.capture = false;
  const TraceAnalysis a = analyze_spec(spec);
  ASSERT_EQ(a.graph_notes.size(), 1u);
  EXPECT_NE(a.graph_notes[0].find("graph 1: 3 replays of 10 nodes, but no capture is in the trace"), std::string::npos)
      << notes(a);
  EXPECT_NE(a.graph_notes[0].find("attention found by kernel names only, without shapes"), std::string::npos);
  expect_by_names(a, 2);
  EXPECT_NE(analysis_text(a).find(a.graph_notes[0]), std::string::npos) << "the report says it";
}

TEST(GraphReplays, AttnprofKernelsAloneNameAttnprof) {
  KinetoGraphSpec spec;
  spec.capture = false;
  spec.attnprof = true;
  expect_by_names(analyze_spec(spec), 2, "attnprof:flash");
}

TEST(GraphReplays, NodeIdsRepeatedAcrossGraphsAreRefused) {
  KinetoGraphSpec spec;
  spec.graphs = 2;
  spec.repeat_node_ids = true;
  const TraceAnalysis a = analyze_spec(spec);
  ASSERT_EQ(a.graph_notes.size(), 2u);
  EXPECT_NE(a.graph_notes[0].find("graph 1: 3 replays of 10 nodes, but node ids repeat across graphs (node 1 is also "
                                  "in graph 2)"),
            std::string::npos)
      << notes(a);
  EXPECT_NE(a.graph_notes[1].find("graph 2: 3 replays of 10 nodes, but node ids repeat across graphs"),
            std::string::npos)
      << notes(a);
  expect_by_names(a, 2);
}

TEST(GraphReplays, CapturesThatCannotBeToldApartAreRefused) {
  KinetoGraphSpec spec;
  spec.unreplayed_captures = 1;  // two captures launch graph 1's sequence; one graph replayed
  const TraceAnalysis a = analyze_spec(spec);
  ASSERT_EQ(a.graph_notes.size(), 1u);
  EXPECT_NE(a.graph_notes[0].find("but 2 captures in the trace launched the same sequence as 1 replayed graphs: which "
                                  "capture made which graph is not known"),
            std::string::npos)
      << notes(a);
  expect_by_names(a, 2);
}

TEST(GraphReplays, ANodeThatDoesNotMatchItsCapturedLaunchRefusesTheTie) {
  // The products replay as kernels that name flash: their captured launches were aten::mm's.
  std::string text = kineto_graph_trace({});
  const std::string gemm = "nvjet_tst_64x8_64x16_2x1_v_bz_TNN";
  for (std::size_t at = text.find(gemm); at != std::string::npos; at = text.find(gemm, at)) {
    text.replace(at, gemm.size(), "pytorch_flash::flash_fwd_kernel");
  }
  const TraceAnalysis a = analyze_trace(parse_chrome_trace(text, "graph.json"), "graph.json");
  ASSERT_EQ(a.graph_notes.size(), 1u);
  EXPECT_NE(a.graph_notes[0].find("but node 1000 runs flash_fwd_kernel (flash) where the launch captured in its place "
                                  "was made by aten::mm: the capture does not match the graph"),
            std::string::npos)
      << notes(a);
  for (const StepAnalysis* s : replays(a)) {
    EXPECT_EQ(s->attention.calls.size(), 1u) << "every kernel names flash now, none other between: one run";
    for (const AttentionCall& c : s->attention.calls) EXPECT_FALSE(c.problem);
  }
}

TEST(GraphReplays, AGraphWithoutAttentionSaysSo) {
  KinetoGraphSpec spec;
  spec.attention = false;
  const TraceAnalysis a = analyze_spec(spec);
  ASSERT_EQ(a.graph_notes.size(), 1u);
  EXPECT_NE(a.graph_notes[0].find("each node tied"), std::string::npos) << notes(a);
  EXPECT_NE(a.graph_notes[0].find("it holds no attention: none of its captured ops is attention"), std::string::npos)
      << notes(a);
  for (const StepAnalysis* s : replays(a)) EXPECT_TRUE(s->attention.calls.empty());
  spec.capture = false;
  const TraceAnalysis b = analyze_spec(spec);
  EXPECT_NE(b.graph_notes.at(0).find("it holds no attention: no kernel of it names an attention backend"),
            std::string::npos)
      << notes(b);
}

TEST(GraphReplays, WithoutStepsTheReplaysFollowTheWholeTrace) {
  KinetoGraphSpec spec;
  spec.steps = false;
  const TraceAnalysis a = analyze_spec(spec);
  ASSERT_EQ(a.steps.size(), 4u);
  EXPECT_EQ(a.steps[0].label, "whole trace");
  EXPECT_TRUE(a.steps[0].attention.calls.empty()) << "the capture ran nothing";
  EXPECT_EQ(a.steps[3].label, "graph 1 replay 3");
  EXPECT_EQ(a.steps[3].launched_in, "whole trace");
  EXPECT_EQ(a.steps[3].attention.calls.size(), 2u);
}

TEST(GraphReplays, DiffFoldsEachReplayIntoTheStepThatLaunchedIt) {
  const TraceAnalysis graph = analyze_spec({});
  KinetoGraphSpec spec;
  spec.capture = false;
  const TraceAnalysis untied = analyze_spec(spec);
  const TraceDiff d = diff_analyses(untied, std::nullopt, graph, std::nullopt);
  EXPECT_DOUBLE_EQ(d.a.steps, 3);
  EXPECT_DOUBLE_EQ(d.b.steps, 3);
  EXPECT_DOUBLE_EQ(d.b.kernels, 9) << "per step: the argmax and its replay's 8 kernels";
  EXPECT_DOUBLE_EQ(d.b.memsets, 2);
  // The attention op's time where the capture is known; the graph's where it is not.
  const auto row = [](const std::vector<DiffRow>& rows, const std::string& name) -> const DiffRow* {
    for (const auto& r : rows) {
      if (r.name == name) return &r;
    }
    return nullptr;
  };
  const DiffRow* sdpa = row(d.ops, "aten::scaled_dot_product_attention");
  ASSERT_TRUE(sdpa) << diff_text(d, 20);
  EXPECT_EQ(sdpa->change, "added");
  EXPECT_DOUBLE_EQ(sdpa->time_b_us, 2 * 22);
  const DiffRow* graph_row = row(d.ops, "(CUDA graph 1)");
  ASSERT_TRUE(graph_row);
  EXPECT_EQ(graph_row->change, "deleted");
  // One step and the replay it launched.
  const TraceDiff one = diff_analyses(graph, 2, graph, 3);
  EXPECT_EQ(one.a_steps.size(), 2u);
  EXPECT_DOUBLE_EQ(one.a.kernels, 9);
}

TEST(GraphReplays, DiffOfAnEagerTraceAndAGraphOneComparesOpForOp) {
  KinetoGraphSpec spec;
  spec.eager = true;
  const TraceAnalysis eager = analyze_spec(spec);
  ASSERT_EQ(eager.steps.size(), 3u);
  EXPECT_TRUE(eager.graph_notes.empty());
  EXPECT_EQ(eager.steps[0].attention.calls.size(), 2u) << "the eager step's own calls";
  const TraceAnalysis graph = analyze_spec({});
  const TraceDiff d = diff_analyses(eager, std::nullopt, graph, std::nullopt);
  EXPECT_DOUBLE_EQ(d.a.kernels, 9);
  EXPECT_DOUBLE_EQ(d.b.kernels, 9);
  for (const char* op : {"aten::scaled_dot_product_attention", "aten::mm", "aten::fill_"}) {
    const auto it = std::find_if(d.ops.begin(), d.ops.end(), [&](const DiffRow& r) { return r.name == op; });
    ASSERT_NE(it, d.ops.end()) << op << "\n" << diff_text(d, 20);
    EXPECT_EQ(it->change, "unchanged") << op << ": the same calls a step, eager and replayed";
    EXPECT_DOUBLE_EQ(it->count_a, it->count_b) << op;
    EXPECT_NEAR(it->time_a_us, it->time_b_us, 1e-9) << op;
  }
  for (const DiffRow& k : d.kernels) EXPECT_EQ(k.change, "unchanged") << k.name;
  // A finding both sides make, "per step" on one and "per replay" on the
  // other, is in neither side's own list.
  for (const Finding& fa : d.only_a) {
    for (const Finding& fb : d.only_b) {
      EXPECT_FALSE(fa.rule == fb.rule && fa.text.substr(0, 20) == fb.text.substr(0, 20))
          << "only in A: " << fa.text << "\nonly in B: " << fb.text;
    }
  }
}

TEST(GraphReplays, ReplayRunsTheCapturedProblem) {
  KinetoGraphSpec spec;
  spec.kv_seq = 256;  // quick on the CPU
  TraceAnalysis a = analyze_spec(spec);
  ReplayOptions o;
  o.device = Device::Cpu;
  o.backends = {"flash"};
  o.run.threads = 2;
  replay_attention(a, o);
  ASSERT_TRUE(a.replay);
  ASSERT_EQ(a.replay->problems.size(), 1u);
  const ReplayProblem& p = a.replay->problems[0];
  EXPECT_EQ(p.label, "forward 1x8x1x128, kv 1x8x256x128 none bf16");
  EXPECT_EQ(p.calls, 6) << "every layer of every replay";
  EXPECT_EQ(p.ran, "flash");
  EXPECT_DOUBLE_EQ(p.trace_us, 22);
  ASSERT_EQ(p.runs.size(), 1u);
  EXPECT_TRUE(p.runs[0].ran) << p.runs[0].note;
}

TEST(GraphReplays, AGraphIdPastCuptisThirtyTwoBitsIsRefusedInOneLine) {
  std::string text = kineto_graph_trace({});
  const std::string id = "\"graph id\": 1,";
  text.replace(text.find(id), id.size(), "\"graph id\": 1099511627776,");
  try {
    (void)parse_chrome_trace(text, "graph.json");
    FAIL() << "a graph id of 2^40 was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"graph id\" is out of range (more than 2^32 - 1)"), std::string::npos)
        << e.what();
  }
}

TEST(GraphReplays, JsonCarriesTheGraphs) {
  const TraceAnalysis a = analyze_spec({});
  const std::string j = analysis_json({a});
  EXPECT_NE(j.find("\"graph_notes\""), std::string::npos);
  EXPECT_NE(j.find("\"found_by\": \"capture\""), std::string::npos);
  EXPECT_NE(j.find("\"launched_in\": \"ProfilerStep#1\""), std::string::npos);
}

// PyTorch 2.11's Kineto with CUDA 13 writes no graph or node ids (as the
// recorded fixtures show): the replays are read from their cudaGraphLaunch's
// correlation, a graph's work numbered as its nodes in start order, and
// tied to the capture as with the ids. Two graphs whose replays run the same
// work cannot be told apart without ids: one graph, refused in one line.
}  // namespace
}  // namespace attnprof
