// Attention calls read from PyTorch's own traces (tests/fixtures/torch/),
// checked against a hand count: the fixtures' JSON read here independently
// (its SDPA ops, their launches and kernels), the FLOPs by the formula.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/report.h"
#include "attnprof/trace_io.h"
#include "common/temp_dir.h"
#include "cpu/findings_lookup.h"

namespace attnprof {
namespace {

using nlohmann::json;
using testing::by_rule;
using testing::dump;

std::string fixture(const std::string& name) {
  return std::string(ATTNPROF_TORCH_FIXTURES) + "/" + name + ".pt.trace.json.gz";
}

json read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  std::string text;
  char buf[1 << 14];
  for (int n; (n = gzread(f, buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  gzclose(f);
  return json::parse(text);
}

// The calls of every step, in time order.
std::vector<AttentionCall> calls_of(const TraceAnalysis& a) {
  std::vector<AttentionCall> out;
  for (const auto& s : a.steps) out.insert(out.end(), s.attention.calls.begin(), s.attention.calls.end());
  return out;
}

// By hand from the JSON: each op named `op` (in time order) and the summed
// durations of the kernels whose launch ran inside it (same thread).
struct HandCall {
  double dur_us = 0;
  double kernel_us = 0;
  int kernels = 0;
};

std::vector<HandCall> hand_count(const json& trace, const std::string& op) {
  const auto& ev = trace["traceEvents"];
  std::vector<const json*> ops;
  for (const auto& e : ev) {
    if (e.value("cat", "") == "cpu_op" && e.value("name", "") == op) ops.push_back(&e);
  }
  std::sort(ops.begin(), ops.end(), [](const json* a, const json* b) { return (*a)["ts"] < (*b)["ts"]; });
  std::vector<HandCall> out;
  for (const json* o : ops) {
    HandCall h;
    h.dur_us = (*o)["dur"].get<double>();
    const double t0 = (*o)["ts"].get<double>(), t1 = t0 + h.dur_us;
    for (const auto& l : ev) {
      if (l.value("cat", "") != "cuda_runtime" || l["tid"] != (*o)["tid"]) continue;
      const double ts = l["ts"].get<double>();
      if (ts < t0 || ts > t1 || !l.contains("args") || !l["args"].contains("correlation")) continue;
      for (const auto& k : ev) {
        if (k.value("cat", "") == "kernel" && k["args"].value("correlation", -1) == l["args"]["correlation"]) {
          h.kernel_us += k["dur"].get<double>();
          ++h.kernels;
        }
      }
    }
    out.push_back(h);
  }
  return out;
}

// 4 * B * H * visible pairs * D, causal top-left over S = Skv.
double causal_flops(double b, double h, double s, double d) { return 4 * b * h * (s * (s + 1) / 2) * d; }

TEST(AttentionCalls, CudaFlashAgainstAHandCount) {
  const TraceAnalysis a = analyze_traces({fixture("cuda_flash")}).at(0);
  const auto calls = calls_of(a);
  const auto hand = hand_count(read_gz(fixture("cuda_flash")), "aten::scaled_dot_product_attention");
  ASSERT_EQ(hand.size(), 2u);
  ASSERT_EQ(calls.size(), hand.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const AttentionCall& c = calls[i];
    EXPECT_EQ(c.op, "aten::scaled_dot_product_attention");
    EXPECT_EQ(c.dispatch, "aten::_scaled_dot_product_flash_attention");
    EXPECT_EQ(c.backend, "flash");
    EXPECT_FALSE(c.backward);
    EXPECT_EQ(c.shape, "2x4x256x64");
    EXPECT_EQ(c.dtype, "bf16");
    EXPECT_EQ(c.mask, "causal");
    ASSERT_TRUE(c.problem.has_value());
    EXPECT_EQ(c.problem->kv_heads, 4);
    EXPECT_EQ(c.problem->kv_seq, 256);
    ASSERT_TRUE(c.flops.has_value());
    EXPECT_DOUBLE_EQ(*c.flops, causal_flops(2, 4, 256, 64));
    EXPECT_EQ(static_cast<int>(c.kernels.size()), hand[i].kernels);
    ASSERT_EQ(c.kernels.size(), 1u);
    EXPECT_NE(c.kernels[0].find("flash_fwd_kernel"), std::string::npos) << c.kernels[0];
    EXPECT_NEAR(c.gpu_us, hand[i].kernel_us, 1e-3);
    EXPECT_NEAR(c.cpu_us, hand[i].dur_us, 1e-3);
    ASSERT_TRUE(c.tflops.has_value());
    EXPECT_NEAR(*c.tflops, *c.flops / (c.gpu_us * 1e-6) / 1e12, 1e-9);
    EXPECT_FALSE(c.ceiling_pct.has_value()) << "no ceiling was given";
    ASSERT_TRUE(c.scale.has_value()) << "SDPA's scale is None; its dispatch op records 0.125";
    EXPECT_DOUBLE_EQ(*c.scale, 0.125);
  }
  for (const auto& s : a.steps) {
    ASSERT_EQ(s.attention.calls.size(), 1u);
    EXPECT_TRUE(s.attention.missing_shapes.empty());
    double kernel_us = 0;
    for (const auto& k : s.kernels_by_time) kernel_us += k.total_us;
    EXPECT_NEAR(s.attention.total_us, kernel_us, 1e-6);
    ASSERT_TRUE(s.attention.forward_pct.has_value());
    EXPECT_NEAR(*s.attention.forward_pct, 100.0 * s.attention.calls[0].gpu_us / kernel_us, 1e-9);
    EXPECT_DOUBLE_EQ(*s.attention.backward_pct, 0);
    const Finding* f = by_rule(s.result.findings, "attention-problems");
    ASSERT_NE(f, nullptr) << dump(s.result.findings);
    EXPECT_EQ(f->severity, Severity::Info);
    EXPECT_NE(f->text.find("attention: 1 flash forward call per step (2x4x256x64, causal, bf16), 1 kernel each"),
              std::string::npos)
        << f->text;
    EXPECT_NE(f->text.find("TFLOP/s"), std::string::npos) << f->text;
  }
}

TEST(AttentionCalls, CeilingGivesPercent) {
  AnalyzeOptions o;
  o.ceiling_tflops = 100;
  const auto calls = calls_of(analyze_traces({fixture("cuda_flash")}, o).at(0));
  ASSERT_FALSE(calls.empty());
  ASSERT_TRUE(calls[0].ceiling_pct.has_value());
  EXPECT_NEAR(*calls[0].ceiling_pct, *calls[0].tflops, 1e-9);  // of 100 TFLOP/s
}

TEST(AttentionCalls, OtherBackendsByTheirDispatch) {
  for (const auto& [name, backend] :
       {std::pair{"cuda_efficient", "efficient"}, std::pair{"cuda_cudnn", "cudnn"}, std::pair{"cuda_math", "math"}}) {
    const auto calls = calls_of(analyze_traces({fixture(name)}).at(0));
    ASSERT_EQ(calls.size(), 2u) << name;
    for (const auto& c : calls) {
      EXPECT_EQ(c.backend, backend) << name;
      EXPECT_EQ(c.shape, "2x4x256x64") << name;
      EXPECT_EQ(c.mask, "causal") << name;
      ASSERT_TRUE(c.flops.has_value()) << name;
      EXPECT_DOUBLE_EQ(*c.flops, causal_flops(2, 4, 256, 64)) << name;
      EXPECT_FALSE(c.kernels.empty()) << name;
    }
  }
  // The hand-written attention of cuda_naive has no attention op: no calls.
  EXPECT_TRUE(calls_of(analyze_traces({fixture("cuda_naive")}).at(0)).empty());
}

TEST(AttentionCalls, TrainingStepHasForwardAndBackward) {
  const TraceAnalysis a = analyze_traces({fixture("cuda_train")}).at(0);
  const json j = read_gz(fixture("cuda_train"));
  const auto hand_bwd = hand_count(j, "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0");
  ASSERT_EQ(hand_bwd.size(), 2u);
  std::vector<AttentionCall> fwd, bwd;
  for (const auto& c : calls_of(a)) (c.backward ? bwd : fwd).push_back(c);
  ASSERT_EQ(fwd.size(), 2u);
  ASSERT_EQ(bwd.size(), 2u);
  for (std::size_t i = 0; i < bwd.size(); ++i) {
    const AttentionCall& c = bwd[i];
    EXPECT_EQ(c.op, "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0");
    EXPECT_EQ(c.dispatch, "aten::_scaled_dot_product_flash_attention_backward");
    EXPECT_EQ(c.backend, "flash");
    EXPECT_EQ(c.shape, "2x4x256x64");
    EXPECT_EQ(c.mask, "causal");
    ASSERT_TRUE(c.scale.has_value());
    EXPECT_DOUBLE_EQ(*c.scale, 0.125);
    ASSERT_TRUE(c.flops && fwd[i].flops);
    EXPECT_DOUBLE_EQ(*c.flops, 2.5 * *fwd[i].flops);
    EXPECT_DOUBLE_EQ(*fwd[i].flops, causal_flops(2, 4, 256, 64));
    EXPECT_EQ(static_cast<int>(c.kernels.size()), hand_bwd[i].kernels);
    EXPECT_NEAR(c.gpu_us, hand_bwd[i].kernel_us, 1e-3);
    bool bwd_kernel = false;
    for (const auto& k : c.kernels) bwd_kernel |= k.find("flash_bwd") != std::string::npos;
    EXPECT_TRUE(bwd_kernel);
  }
  for (const auto& s : a.steps) {
    ASSERT_TRUE(s.attention.backward_pct.has_value());
    EXPECT_GT(*s.attention.backward_pct, 0);
    EXPECT_GT(*s.attention.forward_pct, 0);
    EXPECT_LE(*s.attention.forward_pct + *s.attention.backward_pct, 100.0 + 1e-9);
  }
  const std::string text = analysis_text(a, 10);
  EXPECT_NE(text.find("ProfilerStep#1: attention\n"), std::string::npos) << text;
  EXPECT_NE(text.find("attention of the step's kernel time: forward"), std::string::npos) << text;
  const json out = json::parse(analysis_json({a}));
  const json& att = out["traces"][0]["steps"][0]["attention"];
  ASSERT_EQ(att["calls"].size(), 2u);
  EXPECT_EQ(att["calls"][0]["backend"], "flash");
  EXPECT_EQ(att["calls"][0]["pass"], "forward");
  EXPECT_EQ(att["calls"][1]["pass"], "backward");
  EXPECT_EQ(att["calls"][1]["flops"].get<double>(), 2.5 * causal_flops(2, 4, 256, 64));
  EXPECT_TRUE(att["missing_shapes"].is_null());
}

TEST(AttentionCalls, CpuMathTakesHostTime) {
  const TraceAnalysis a = analyze_traces({fixture("cpu_math")}).at(0);
  ASSERT_FALSE(a.gpu);
  const auto hand = hand_count(read_gz(fixture("cpu_math")), "aten::scaled_dot_product_attention");
  const auto calls = calls_of(a);
  ASSERT_EQ(hand.size(), 2u);
  ASSERT_EQ(calls.size(), 2u);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const AttentionCall& c = calls[i];
    EXPECT_EQ(c.backend, "math");
    EXPECT_EQ(c.dtype, "fp32");
    EXPECT_EQ(c.shape, "1x2x128x32");
    EXPECT_TRUE(c.kernels.empty());
    EXPECT_NEAR(c.cpu_us, hand[i].dur_us, 1e-3);
    ASSERT_TRUE(c.flops && c.tflops);
    EXPECT_DOUBLE_EQ(*c.flops, causal_flops(1, 2, 128, 32));
    EXPECT_NEAR(*c.tflops, *c.flops / (c.cpu_us * 1e-6) / 1e12, 1e-12);
  }
  const std::string text = analysis_text(a, 10);
  EXPECT_NE(text.find("attention of the step's host time: forward"), std::string::npos) << text;
  EXPECT_NE(text.find("CPU time"), std::string::npos) << text;
}

TEST(AttentionCalls, WithoutShapesOneLineSaysHowToRecordThem) {
  json j = read_gz(fixture("cuda_flash"));
  for (auto& e : j["traceEvents"]) {
    if (e.contains("args")) e["args"].erase("Input Dims");
  }
  testing::TempDir dir;
  const std::string path = dir.str("noshapes.json");
  std::ofstream(path) << j.dump();
  const TraceAnalysis a = analyze_traces({path}).at(0);
  const auto calls = calls_of(a);
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& c : calls) {
    EXPECT_EQ(c.backend, "flash") << "the dispatch op still names it";
    EXPECT_FALSE(c.flops.has_value());
    EXPECT_FALSE(c.tflops.has_value());
    EXPECT_TRUE(c.shape.empty());
    EXPECT_GT(c.gpu_us, 0);
  }
  const std::string text = analysis_text(a, 10);
  std::size_t lines = 0;
  for (std::size_t p = 0; (p = text.find("record_shapes=True", p)) != std::string::npos; ++p) ++lines;
  EXPECT_EQ(lines, a.steps.size()) << "one line per step\n" << text;
  EXPECT_NE(text.find("torch.profiler.profile(record_shapes=True)"), std::string::npos) << text;
  const Finding* f = by_rule(a.steps[0].result.findings, "attention-problems");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->text.find("shapes not recorded"), std::string::npos) << f->text;
}

// A CPU trace made by hand: one op per call at the top level, with the
// record_shapes columns PyTorch writes for it.
Activity op(std::string name, std::int64_t start_us, std::string dims, std::string types,
            std::vector<std::string> concrete) {
  Activity a;
  a.type = ActivityType::CpuOp;
  a.name = std::move(name);
  a.start_ns = start_us * 1000;
  a.dur_ns = 100'000;
  a.input_dims = std::move(dims);
  a.input_dtypes = std::move(types);
  a.concrete_inputs = std::move(concrete);
  return a;
}

TEST(AttentionCalls, FlashAttnWindowsGroupedQueryAndAttnprofOps) {
  Trace t;
  // flash_attn's [B, S, H, D], grouped-query K/V (2 heads), causal bottom-right, a window of 63 keys on the left.
  t.activities.push_back(op("flash_attn::_flash_attn_forward", 0, "[1, 128, 8, 64], [1, 256, 2, 64], [1, 256, 2, 64]",
                            "c10::BFloat16, c10::BFloat16, c10::BFloat16, Scalar, Scalar, Scalar, Scalar, Scalar",
                            {"", "", "", "0.", "0.125", "True", "63", "0"}));
  // attnprof's op, its mask by name.
  t.activities.push_back(op("attnprof::attention", 200, "[2, 4, 64, 32], [2, 4, 64, 32], [2, 4, 64, 32]",
                            "float, float, float, , , , ,", {"", "", "", "flash", "none", "", "", "False"}));
  // SDPA with a boolean mask tensor.
  t.activities.push_back(op("aten::scaled_dot_product_attention", 400,
                            "[1, 2, 16, 8], [1, 2, 16, 8], [1, 2, 16, 8], [1, 1, 16, 16], [], [], [], []",
                            "float, float, float, bool, Scalar, Scalar, , Scalar",
                            {"", "", "", "", "0.", "False", "", "False"}));
  // The Concrete Inputs survive attnprof's own writer and reader.
  const Trace back = parse_chrome_trace(chrome_trace_json(t));
  ASSERT_EQ(back.activities.size(), 3u);
  EXPECT_EQ(back.activities[0].concrete_inputs, t.activities[0].concrete_inputs);
  const auto calls = calls_of(analyze_trace(back, "hand.json"));
  ASSERT_EQ(calls.size(), 3u);

  const AttentionCall& fa = calls[0];
  EXPECT_EQ(fa.backend, "flash_attn");
  EXPECT_EQ(fa.shape, "1x8x128x64, kv 1x2x256x64");
  EXPECT_EQ(fa.mask, "sliding-window");
  ASSERT_TRUE(fa.problem && fa.flops);
  EXPECT_EQ(fa.problem->window, 64);
  // By hand: query i sees keys (i + 128 - 64, i + 128], all inside [0, 256): 64 each.
  EXPECT_DOUBLE_EQ(*fa.flops, 4.0 * 1 * 8 * (128.0 * 64) * 64);
  EXPECT_DOUBLE_EQ(*fa.scale, 0.125);

  const AttentionCall& ours = calls[1];
  EXPECT_EQ(ours.backend, "attnprof:flash");
  EXPECT_EQ(ours.mask, "none");
  ASSERT_TRUE(ours.flops);
  EXPECT_DOUBLE_EQ(*ours.flops, 4.0 * 2 * 4 * (64.0 * 64) * 32);
  EXPECT_NEAR(ours.cpu_us, 100, 1e-9);
  ASSERT_TRUE(ours.tflops);
  EXPECT_NEAR(*ours.tflops, *ours.flops / 100e-6 / 1e12, 1e-12);

  const AttentionCall& sdpa = calls[2];
  EXPECT_EQ(sdpa.backend, "unknown") << "no dispatch op, no kernel";
  EXPECT_EQ(sdpa.mask, "boolean");
  ASSERT_TRUE(sdpa.flops);
  EXPECT_DOUBLE_EQ(*sdpa.flops, 4.0 * 1 * 2 * (16.0 * 16) * 8);
}

// A compiled graph's first run (cudagraph trees' warm-up) calls attnprof's
// op through a dispatch mode: the op, inside it the same op again, and the
// label the implementation opened inside the inner one (as recorded in
// tests/fixtures/graphs/generate_attnprof). The call is the outer op, and the
// inner op's label names its backend and mask.
TEST(AttentionCalls, AttnprofsLabelInsideTheSameOpNestedThroughADispatchMode) {
  Trace t;
  const auto at = [](ActivityType type, std::string name, std::int64_t start_us, std::int64_t dur_us) {
    Activity a;
    a.type = type;
    a.name = std::move(name);
    a.start_ns = start_us * 1000;
    a.dur_ns = dur_us * 1000;
    return a;
  };
  Activity outer = op("attnprof::attention", 0, "[1, 1, 4, 64], [1, 27, 2, 64], [1, 27, 2, 64]",
                      "c10::BFloat16, c10::BFloat16, c10::BFloat16", {"", "", "", "", "", "", "", "True"});
  outer.concrete_inputs.assign(23, "");
  t.activities.push_back(outer);
  t.activities.push_back(at(ActivityType::CpuOp, "PythonDispatchMode", 2, 96));
  Activity inner = outer;
  inner.start_ns = 4'000;
  inner.dur_ns = 90'000;
  t.activities.push_back(inner);
  t.activities.push_back(
      at(ActivityType::UserAnnotation, "attnprof.attention backend=flash mask=none window=0", 6, 80));
  const auto calls = calls_of(analyze_trace(parse_chrome_trace(chrome_trace_json(t)), "nested.json"));
  ASSERT_EQ(calls.size(), 1u) << "the inner op is the outer one's call";
  EXPECT_EQ(calls[0].backend, "attnprof:flash");
  EXPECT_EQ(calls[0].mask, "none");
  EXPECT_TRUE(calls[0].flops);

  // The label directly inside the op (an eager call) reads the same.
  t.activities.erase(t.activities.begin() + 1, t.activities.begin() + 3);
  const auto eager = calls_of(analyze_trace(parse_chrome_trace(chrome_trace_json(t)), "eager.json"));
  ASSERT_EQ(eager.size(), 1u);
  EXPECT_EQ(eager[0].backend, "attnprof:flash");
  EXPECT_EQ(eager[0].mask, "none");
}

TEST(AttentionCalls, CopiesOutsideAttentionAreInformation) {
  // cuda_naive: attention written by hand, no attention op: masked_fill's copy is the model's.
  const TraceAnalysis naive = analyze_traces({fixture("cuda_naive")}).at(0);
  for (const auto& s : naive.steps) {
    const Finding* copy = by_rule(s.result.findings, "hidden-copy");
    ASSERT_NE(copy, nullptr) << dump(s.result.findings);
    EXPECT_EQ(copy->severity, Severity::Info);
    EXPECT_NE(copy->text.find("masked_fill"), std::string::npos) << copy->text;
    EXPECT_NE(copy->text.find("outside attention"), std::string::npos) << copy->text;
  }
  // cuda_math: the upcasts are SDPA's math path's own: they stay warnings.
  const TraceAnalysis math = analyze_traces({fixture("cuda_math")}).at(0);
  for (const auto& s : math.steps) {
    const Finding* up = by_rule(s.result.findings, "upcast-fp32");
    ASSERT_NE(up, nullptr) << dump(s.result.findings);
    EXPECT_EQ(up->severity, Severity::Warning);
    EXPECT_EQ(up->text.find("outside attention"), std::string::npos) << up->text;
  }
}

}  // namespace
}  // namespace attnprof
