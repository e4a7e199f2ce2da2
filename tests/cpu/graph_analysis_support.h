// What the tests of analyze on CUDA graph traces share (graph_analyze_test.cpp,
// graph_ids_test.cpp): a synthetic trace analysed, its replay steps, an op's
// row, the graph notes as one text, and a refused tie's calls checked.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/report.h"
#include "attnprof/trace_reader.h"
#include "common/kineto_trace.h"
#include "findings_lookup.h"

namespace attnprof::testing {

inline TraceAnalysis analyze_spec(const KinetoGraphSpec& spec) {
  return analyze_trace(parse_chrome_trace(kineto_graph_trace(spec), "graph.json"), "graph.json");
}

inline std::vector<const StepAnalysis*> replays(const TraceAnalysis& a) {
  std::vector<const StepAnalysis*> out;
  for (const auto& s : a.steps) {
    if (s.graph_id != 0) out.push_back(&s);
  }
  return out;
}

inline const OpRow* op_row(const StepAnalysis& s, const std::string& name) {
  for (const auto& o : s.ops) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

inline std::string notes(const TraceAnalysis& a) {
  std::string s;
  for (const auto& n : a.graph_notes) s += n + "\n";
  return s;
}

// Refused ties: one line each, attention still found by kernel names, no shape.
inline void expect_by_names(const TraceAnalysis& a, int per_replay, const std::string& backend = "flash") {
  for (const StepAnalysis* s : replays(a)) {
    ASSERT_EQ(s->attention.calls.size(), static_cast<std::size_t>(per_replay)) << s->label << "\n" << notes(a);
    for (const AttentionCall& c : s->attention.calls) {
      EXPECT_EQ(c.found_by, "kernel names");
      EXPECT_EQ(c.backend, backend);
      EXPECT_FALSE(c.problem);
      EXPECT_TRUE(c.shape.empty());
      EXPECT_FALSE(c.flops);
      EXPECT_EQ(c.kernels.size(), 2u) << "the split kernel and its combine, one call";
    }
    EXPECT_FALSE(by_rule(s->result.findings, "graph-attention-roof"));
    const std::string graph = "(CUDA graph " + std::to_string(s->graph_id) + ")";
    ASSERT_TRUE(op_row(*s, graph)) << analysis_text(a);
    EXPECT_FALSE(op_row(*s, "aten::mm"));
  }
}

}  // namespace attnprof::testing
