// analyze and diff over torch.profiler-shaped traces built by hand: per step
// the counts, the per-op and per-kernel tables, and the findings of the same
// rule table compare uses; the command's output, --json, and its refusals.
#include "attnprof/analyze.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "attnprof/error.h"
#include "attnprof/report.h"
#include "attnprof/trace_io.h"
#include "common/kineto_trace.h"
#include "common/temp_dir.h"
#include "cpu/synthetic_trace.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof {
namespace {

namespace fs = std::filesystem;
using testing::kineto_trace;
using testing::KinetoTraceSpec;

TraceAnalysis analyse(const KinetoTraceSpec& spec, AnalyzeOptions o = {}) {
  return analyze_trace(parse_chrome_trace(kineto_trace(spec)), "hand.json", o);
}

const Finding* finding(const StepAnalysis& s, std::string_view rule) {
  for (const auto& f : s.result.findings) {
    if (f.rule == rule) return &f;
  }
  return nullptr;
}

std::string rules_of(const StepAnalysis& s) {
  std::string r;
  for (const auto& f : s.result.findings) r += f.rule + ": " + f.text + "\n";
  return r;
}

TEST(Analyze, NaiveStepsCountsOpsKernelsAndFindings) {
  const TraceAnalysis a = analyse({.steps = 3, .layers_per_step = 2});
  EXPECT_TRUE(a.gpu);
  ASSERT_EQ(a.steps.size(), 3u);
  EXPECT_EQ(a.events_outside_steps, 0u);
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    const StepAnalysis& s = a.steps[i];
    SCOPED_TRACE(s.label);
    EXPECT_EQ(s.label, "ProfilerStep#" + std::to_string(i + 1));
    EXPECT_EQ(s.result.source, "hand.json");
    EXPECT_EQ(s.result.metrics.steps, 1);  // the step is the call
    EXPECT_EQ(s.kernels, 10);              // 5 per layer
    EXPECT_EQ(s.memcpys, 2);
    EXPECT_EQ(s.memsets, 0);
    EXPECT_DOUBLE_EQ(s.memcpy_bytes, 2.0 * 33554432);
    EXPECT_EQ(s.tensor_core_gemms, 4);
    EXPECT_EQ(s.cuda_core_gemms, 0);
    ASSERT_TRUE(s.host_us_per_launch.has_value());
    // Top-level ops: the products launched 4 kernels, masked_fill a memcpy and a kernel.
    std::map<std::string, OpRow> ops;
    for (const auto& o : s.ops) ops[o.name] = o;
    EXPECT_EQ(ops["aten::matmul"].calls, 4);
    EXPECT_EQ(ops["aten::matmul"].kernels, 4);
    EXPECT_EQ(ops["aten::masked_fill"].calls, 2);
    EXPECT_EQ(ops["aten::masked_fill"].memcpys, 2);
    EXPECT_EQ(ops["aten::masked_fill"].kernels, 2);
    EXPECT_EQ(ops.count("aten::bmm"), 0u) << "bmm runs inside matmul: not top level";
    // Top kernels: the products first, each with its computed occupancy.
    ASSERT_FALSE(s.kernels_by_time.empty());
    const KernelRow& top = s.kernels_by_time.front();
    EXPECT_EQ(top.name, "nvjet_tst_128x64_64x4_1x2_h_bz_TNT");
    EXPECT_EQ(top.count, 4);
    EXPECT_EQ(top.gemm, "tensor cores");
    ASSERT_TRUE(top.occupancy_pct.has_value());
    EXPECT_NEAR(*top.occupancy_pct, 18.75, 1e-9);

    const Finding* copy = finding(s, "hidden-copy");
    ASSERT_NE(copy, nullptr) << rules_of(s);
    // No attention op in the trace (attention written by hand): the model's copy, information.
    EXPECT_EQ(
        copy->text,
        "hidden copy: masked_fill (its copy_) makes 2 device-to-device copy per step (64.0 MiB), outside attention");
    EXPECT_EQ(copy->severity, Severity::Info);
    ASSERT_NE(finding(s, "low-occupancy"), nullptr) << rules_of(s);
    const Finding* ex = finding(s, "launch-kernel-ex");
    ASSERT_NE(ex, nullptr) << rules_of(s);
    EXPECT_EQ(ex->text,
              "main kernel launched through the driver's cuLaunchKernelEx; occupancy 19% computed from its record");
    EXPECT_EQ(finding(s, "fp32-gemm"), nullptr);
    EXPECT_EQ(finding(s, "mask-rebuilt"), nullptr);
  }
}

TEST(Analyze, InPlaceHasNoHiddenCopy) {
  const TraceAnalysis a = analyse({.steps = 1, .in_place = true});
  ASSERT_EQ(a.steps.size(), 1u);
  EXPECT_EQ(a.steps[0].memcpys, 0);
  EXPECT_EQ(finding(a.steps[0], "hidden-copy"), nullptr) << rules_of(a.steps[0]);
}

TEST(Analyze, MathPathUpcastsFp32GemmsMaskAndSafeSoftmax) {
  const TraceAnalysis a = analyse({.steps = 2, .in_place = true, .fp32_math = true});
  ASSERT_EQ(a.steps.size(), 2u);
  const StepAnalysis& s = a.steps[1];
  EXPECT_EQ(s.cuda_core_gemms, 2);
  EXPECT_EQ(s.tensor_core_gemms, 0);
  const Finding* up = finding(s, "upcast-fp32");
  ASSERT_NE(up, nullptr) << rules_of(s);
  // No attention op in this trace: the upcast is the model's, information naming the op.
  EXPECT_EQ(up->text, "upcasts 1 bf16 tensors to FP32 per step outside attention, made by aten::to (top level)");
  EXPECT_EQ(up->severity, Severity::Info);
  const Finding* gemm = finding(s, "fp32-gemm");
  ASSERT_NE(gemm, nullptr) << rules_of(s);
  EXPECT_EQ(gemm->text,
            "FP32 GEMM on bf16 inputs (CUDA cores, no tensor cores): "
            "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3");
  EXPECT_DOUBLE_EQ(gemm->figures.at("fp32_kernels_per_forward"), 2);
  const Finding* mask = finding(s, "mask-rebuilt");
  ASSERT_NE(mask, nullptr) << rules_of(s);
  EXPECT_EQ(mask->text, "mask rebuilt on every step (ones, tril, where)");
  EXPECT_NE(finding(s, "nan-safe-softmax"), nullptr) << rules_of(s);
  EXPECT_EQ(finding(s, "hidden-copy"), nullptr) << "a conversion's copy is the upcast rule's\n" << rules_of(s);
}

TEST(Analyze, WithoutShapesFp32GemmKernelsStillShow) {
  const TraceAnalysis a = analyse({.steps = 1, .in_place = true, .fp32_math = true, .record_shapes = false});
  const StepAnalysis& s = a.steps[0];
  EXPECT_EQ(finding(s, "fp32-gemm"), nullptr);
  const Finding* g = finding(s, "gemm-cuda-cores");
  ASSERT_NE(g, nullptr) << rules_of(s);
  EXPECT_NE(g->text.find("FP32 GEMM kernels on CUDA cores, no tensor cores: 2 per step"), std::string::npos) << g->text;
}

TEST(Analyze, LaunchBoundStepsAreNamed) {
  // Short kernels far apart: one layer's launches spread over 100 us.
  const TraceAnalysis a = analyse({.steps = 1, .layers_per_step = 3, .in_place = true, .kernel_scale = 0.05});
  const StepAnalysis& s = a.steps[0];
  ASSERT_TRUE(s.gpu_idle_pct.has_value());
  const Finding* f = finding(s, "launch-bound");
  ASSERT_NE(f, nullptr) << rules_of(s) << " idle " << *s.gpu_idle_pct;
  EXPECT_GE(f->figures.at("gpu_idle_pct"), 50);
  EXPECT_NE(f->text.find("us of host time per launch"), std::string::npos);
}

TEST(Analyze, OneStepByNumberAndNoStepsMeansTheWholeTrace) {
  AnalyzeOptions o;
  o.step = 2;
  const TraceAnalysis a = analyse({.steps = 3}, o);
  ASSERT_EQ(a.steps.size(), 1u);
  EXPECT_EQ(a.steps[0].label, "ProfilerStep#2");
  o.step = 9;
  try {
    (void)analyse({.steps = 3}, o);
    ADD_FAILURE() << "step 9 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("has no ProfilerStep#9 (it has ProfilerStep#1"), std::string::npos)
        << e.what();
  }
  // Our own trace of one forward with its step: the forward is the call.
  const TraceAnalysis ours =
      analyze_trace(parse_chrome_trace(chrome_trace_json(testing::attention_trace())), "ours.json");
  ASSERT_EQ(ours.steps.size(), 1u);
  EXPECT_EQ(ours.steps[0].result.metrics.steps, 1);
  const Finding* copy = finding(ours.steps[0], "hidden-copy");
  ASSERT_NE(copy, nullptr) << rules_of(ours.steps[0]);
  EXPECT_EQ(copy->text, "hidden copy: masked_fill (its copy_) makes 1 device-to-device copy per forward (32.0 MiB)");
  EXPECT_EQ(copy->severity, Severity::Warning) << "attnprof's own forward ranges hold only attention";
  // A trace without steps: one "whole trace" call.
  Trace bare = testing::attention_trace();
  bare.activities.erase(bare.activities.begin());  // the ProfilerStep range
  std::erase_if(bare.activities, [](const Activity& x) { return x.name == "forward"; });
  const TraceAnalysis whole = analyze_trace(std::move(bare), "bare.json");
  ASSERT_EQ(whole.steps.size(), 1u);
  EXPECT_EQ(whole.steps[0].label, "whole trace");
  EXPECT_EQ(whole.steps[0].kernels, 5);
  EXPECT_NE(finding(whole.steps[0], "hidden-copy"), nullptr) << rules_of(whole.steps[0]);
  EXPECT_NE(finding(whole.steps[0], "hidden-copy")->text.find("in the trace"), std::string::npos);
}

TEST(Analyze, CpuTraceReadsAsCpu) {
  const std::string text = R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::masked_fill", "pid": 1, "tid": 1, "ts": 10, "dur": 50,
     "args": {"Input type": ["float", "bool", "Scalar"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::clone", "pid": 1, "tid": 1, "ts": 11, "dur": 30},
    {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 1, "ts": 12, "dur": 20},
    {"ph": "X", "cat": "cpu_op", "name": "aten::clone", "pid": 1, "tid": 1, "ts": 70, "dur": 20},
    {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 1, "ts": 71, "dur": 10}]})";
  const TraceAnalysis a = analyze_trace(parse_chrome_trace(text), "cpu.json");
  EXPECT_FALSE(a.gpu);
  ASSERT_EQ(a.steps.size(), 1u);
  const Finding* copy = finding(a.steps[0], "hidden-copy");
  ASSERT_NE(copy, nullptr) << rules_of(a.steps[0]);
  EXPECT_NE(copy->text.find("hidden copy: masked_fill"), std::string::npos) << copy->text;
  EXPECT_DOUBLE_EQ(copy->figures.at("copies_per_forward"), 1) << "the top-level clone was asked for";
  const std::string out = analysis_text(a);
  EXPECT_NE(out.find("no GPU events: read as a CPU trace"), std::string::npos) << out;
}

TEST(Diff, NaiveAgainstInPlace) {
  const TraceAnalysis naive = analyse({.steps = 2, .layers_per_step = 2});
  const TraceAnalysis inplace = analyse({.steps = 3, .layers_per_step = 2, .in_place = true});
  const TraceDiff d = diff_analyses(naive, std::nullopt, inplace, std::nullopt);
  EXPECT_DOUBLE_EQ(d.a.steps, 2);
  EXPECT_DOUBLE_EQ(d.b.steps, 3);
  EXPECT_DOUBLE_EQ(d.a.memcpys, 2);  // per step
  EXPECT_DOUBLE_EQ(d.b.memcpys, 0);
  EXPECT_DOUBLE_EQ(d.a.kernels, d.b.kernels);
  ASSERT_EQ(d.only_a.size(), 1u);
  EXPECT_EQ(d.only_a[0].rule, "hidden-copy");
  std::set<std::string> only_b;
  for (const auto& f : d.only_b) only_b.insert(f.rule);
  // In place, the step is shorter on the GPU but not on the host: CPU-bound.
  EXPECT_EQ(only_b, (std::set<std::string>{"masked-fill-in-place", "cpu-bound"}));
  std::map<std::string, DiffRow> ops;
  for (const auto& r : d.ops) ops[r.name] = r;
  EXPECT_EQ(ops["aten::masked_fill"].change, "deleted");
  EXPECT_EQ(ops["aten::masked_fill_"].change, "added");
  EXPECT_DOUBLE_EQ(ops["aten::matmul"].count_a, 4);
  EXPECT_DOUBLE_EQ(ops["aten::matmul"].count_b, 4);
  EXPECT_EQ(ops["aten::matmul"].change, "unchanged");
  const std::string text = diff_text(d);
  EXPECT_NE(text.find("findings only in A:\n  [hidden-copy] hidden copy: masked_fill"), std::string::npos) << text;
  EXPECT_NE(text.find("memcpys"), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(diff_json(d));
  EXPECT_EQ(j["findings_only_a"][0]["rule"], "hidden-copy");
  EXPECT_EQ(j["a"]["totals"]["memcpys"], 2.0);
}

TEST(Diff, KernelsThatAppearAndVanish) {
  const TraceAnalysis bf16 = analyse({.steps = 1, .in_place = true});
  const TraceAnalysis fp32 = analyse({.steps = 1, .in_place = true, .fp32_math = true});
  const TraceDiff d = diff_analyses(bf16, 1, fp32, 1);
  EXPECT_EQ(d.a_label, "hand.json ProfilerStep#1");
  std::map<std::string, DiffRow> k;
  for (const auto& r : d.kernels) k[r.name] = r;
  EXPECT_EQ(k["nvjet_tst_128x64_64x4_1x2_h_bz_TNT"].change, "deleted");
  EXPECT_EQ(k["sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3"].change, "added");
  std::set<std::string> only_b;
  for (const auto& f : d.only_b) only_b.insert(f.rule);
  EXPECT_TRUE(only_b.count("fp32-gemm"));
  EXPECT_TRUE(only_b.count("mask-rebuilt"));
  const std::string text = diff_text(d);
  EXPECT_NE(text.find("kernels that appeared in B (2):"), std::string::npos) << text;
  EXPECT_NE(text.find("kernels that vanished from A (1):"), std::string::npos) << text;
}

// ---- The command ------------------------------------------------------------------------

struct Dir : testing::TempDir {
  Dir() : testing::TempDir("attnprof_analyze") {}
  std::string operator/(const std::string& f) const { return str(f); }
};

struct CliRun {
  int code;
  std::string out, err;
};

CliRun cli(const Dir& dir, const std::string& args) {
  const std::string cmd =
      std::string(ATTNPROF_CLI_PATH) + " " + args + " >" + (dir / ".out") + " 2>" + (dir / ".err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  const auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(dir / ".out"), slurp(dir / ".err")};
  fs::remove(dir / ".out");
  fs::remove(dir / ".err");
  return r;
}

void write(const std::string& path, const std::string& text, bool gzip = false) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
    gzclose(f);
  } else {
    std::ofstream(path) << text;
  }
}

TEST(AnalyzeCommand, PrintsStepsFindingsOpsAndKernelsAndWritesJson) {
  Dir dir;
  write(dir / "naive.pt.trace.json.gz", kineto_trace({.steps = 2}), /*gzip=*/true);
  const CliRun r = cli(dir, "analyze " + (dir / "naive.pt.trace.json.gz") + " --json " + (dir / "out.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* want : {"device: NVIDIA H100 80GB HBM3 (sm90, 132 SMs)", "ProfilerStep#1", "ProfilerStep#2",
                           "hidden copy: masked_fill (its copy_) makes 1 device-to-device copy per step",
                           "main kernel launched through the driver's cuLaunchKernelEx",
                           "ProfilerStep#2: top-level ops", "aten::masked_fill", "ProfilerStep#1: top kernels by time",
                           "nvjet_tst_128x64_64x4_1x2_h_bz_TNT", "19% (driver)"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.out;
  }
  std::ifstream f(dir / "out.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["traces"].size(), 1u);
  const auto& step = j["traces"][0]["steps"][0];
  EXPECT_EQ(step["label"], "ProfilerStep#1");
  EXPECT_EQ(step["kernels"], 5);
  EXPECT_EQ(step["memcpys"], 1);
  bool copy = false;
  for (const auto& f : step["findings"]) copy |= f["rule"] == "hidden-copy" && !f["evidence"].empty();
  EXPECT_TRUE(copy) << step["findings"].dump(1);
  EXPECT_EQ(step["ops"][0]["name"], "aten::matmul");
  EXPECT_EQ(step["kernels_by_time"][0]["gemm"], "tensor cores");
}

TEST(AnalyzeCommand, EachBadTraceIsOneLineAndExit4AndNothingWritten) {
  Dir dir;
  write(dir / "good.json", kineto_trace({.steps = 1}));
  write(dir / "truncated.json", kineto_trace({.steps = 1}).substr(0, 700));
  write(dir / "text.json", "this is not json\n");
  write(dir / "other.json", R"({"hello": [1, 2, 3]})");
  write(dir / "deep.json", "{\"traceEvents\": [" + std::string(5000, '['));
  const std::pair<const char*, const char*> cases[] = {
      {"truncated.json", "truncated"}, {"text.json", "not JSON"},        {"other.json", "not a Chrome trace"},
      {"deep.json", "nested deeper"},  {"missing.json", "no such file"},
  };
  for (const auto& [file, why] : cases) {
    const std::size_t before = dir.files();
    const CliRun r = cli(dir, "analyze " + (dir / "good.json") + " " + (dir / file) + " --json " + (dir / "out.json"));
    EXPECT_EQ(r.code, 4) << file << ": " << r.err;
    EXPECT_EQ(r.out, "") << "nothing printed when a trace cannot be read";
    EXPECT_EQ(r.err, "attnprof: cannot read " + (dir / file) + ": " + r.err.substr(r.err.find(": ", 10) + 2));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
    EXPECT_EQ(dir.files(), before) << "nothing written";
  }
  const CliRun diff = cli(dir, "diff " + (dir / "good.json") + " " + (dir / "text.json"));
  EXPECT_EQ(diff.code, 4);
  EXPECT_NE(diff.err.find("not JSON"), std::string::npos) << diff.err;
}

TEST(AnalyzeCommand, DiffTwoStepsOfOneTraceAndUsageErrors) {
  Dir dir;
  write(dir / "t.json", kineto_trace({.steps = 3}));
  const CliRun r = cli(dir, "diff " + (dir / "t.json") + " --step 1 --step 3 --json " + (dir / "d.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("A: " + (dir / "t.json") + " ProfilerStep#1 (1 step)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("B: " + (dir / "t.json") + " ProfilerStep#3 (1 step)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("findings only in A: none"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir / "d.json"));
  EXPECT_EQ(cli(dir, "diff " + (dir / "t.json")).code, 2);
  EXPECT_EQ(cli(dir, "diff --step 1 " + (dir / "t.json") + " " + (dir / "t.json")).code, 2);
  EXPECT_EQ(cli(dir, "analyze").code, 2);
  const CliRun no_step = cli(dir, "analyze " + (dir / "t.json") + " --step 7");
  EXPECT_EQ(no_step.code, 2);
  EXPECT_NE(no_step.err.find("has no ProfilerStep#7"), std::string::npos) << no_step.err;
  // The replay's options without --replay are refused, not dropped.
  const CliRun bound = cli(dir, "analyze " + (dir / "t.json") + " --replay-max-gflop 1");
  EXPECT_EQ(bound.code, 2);
  EXPECT_NE(bound.err.find("--replay-max-gflop go with --replay"), std::string::npos) << bound.err;
  const CliRun help = cli(dir, "analyze --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("Examples:"), std::string::npos);
  EXPECT_NE(cli(dir, "diff --help").out.find("TraceDiff"), std::string::npos);
}

}  // namespace
}  // namespace attnprof
