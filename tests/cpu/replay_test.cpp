// analyze --replay: the trace's attention problems through attnprof's
// backends here, set against the trace's own time; a trace from a device this
// machine lacks replayed only when asked; hostile shapes one line each.
#include "attnprof/replay.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/error.h"
#include "attnprof/report.h"
#include "attnprof/trace_io.h"
#include "common/temp_dir.h"

namespace attnprof {
namespace {

using nlohmann::json;

std::string fixture(const std::string& name) {
  return std::string(ATTNPROF_TORCH_FIXTURES) + "/" + name + ".pt.trace.json.gz";
}

bool cuda_here() {
  if (!cuda_built()) return false;
  try {
    (void)device_runtime(Device::Cuda);
    return true;
  } catch (const Error&) {
    return false;
  }
}

ReplayOptions quick(std::optional<Device> device = {}) {
  ReplayOptions o;
  o.device = device;
  o.run.schedule = {.wait = 0, .warmup = 0, .active = 2, .repeat = 1};
  o.run.threads = 2;
  return o;
}

const ReplayRun* run_of(const ReplayProblem& p, const std::string& backend) {
  for (const auto& r : p.runs) {
    if (r.backend == backend) return &r;
  }
  return nullptr;
}

TEST(Replay, CpuTraceReplaysEachDistinctProblemAgainstItsTime) {
  TraceAnalysis a = analyze_traces({fixture("cpu_math")}).at(0);
  std::vector<double> times;
  for (const auto& s : a.steps) {
    for (const auto& c : s.attention.calls) times.push_back(c.cpu_us);
  }
  ASSERT_EQ(times.size(), 2u) << "one SDPA call in each of the two steps";
  replay_attention(a, quick());
  ASSERT_TRUE(a.replay);
  const TraceReplay& r = *a.replay;
  EXPECT_EQ(r.trace_device, "cpu");
  EXPECT_EQ(r.device, "cpu");
  EXPECT_TRUE(r.note.empty()) << r.note;
  ASSERT_EQ(r.problems.size(), 1u) << "the same problem in both steps";
  const ReplayProblem& p = r.problems[0];
  EXPECT_EQ(p.label, "forward 1x2x128x32 causal fp32");
  EXPECT_EQ(p.calls, 2);
  EXPECT_EQ(p.ran, "math");
  EXPECT_NEAR(p.trace_us, (times[0] + times[1]) / 2, 1e-9);
  EXPECT_TRUE(p.skipped.empty()) << p.skipped;
  ASSERT_TRUE(p.problem);
  EXPECT_EQ(p.problem->device, Device::Cpu);
  EXPECT_EQ(p.problem->mask, MaskKind::Causal);
  for (const char* b : {"naive", "math", "flash"}) {
    const ReplayRun* x = run_of(p, b);
    ASSERT_NE(x, nullptr) << b;
    EXPECT_TRUE(x->ran) << b << ": " << x->note;
    ASSERT_TRUE(x->us && x->ratio) << b;
    EXPECT_GT(*x->us, 0);
    EXPECT_NEAR(*x->ratio, *x->us / p.trace_us, 1e-12);
  }
  // GPU-only backends: listed with explain()'s reason, not run.
  const ReplayRun* cudnn = run_of(p, "cudnn");
  ASSERT_NE(cudnn, nullptr);
  EXPECT_FALSE(cudnn->ran);
  EXPECT_NE(cudnn->note.find("not eligible"), std::string::npos) << cudnn->note;
  // The fastest is the least time among those that ran.
  ASSERT_FALSE(p.fastest.empty());
  for (const auto& x : p.runs) {
    if (x.ran) EXPECT_LE(*run_of(p, p.fastest)->us, *x.us) << x.backend;
  }
  const std::string text = analysis_text(a);
  EXPECT_NE(text.find("replay on cpu"), std::string::npos) << text;
  EXPECT_NE(text.find("fastest: " + p.fastest), std::string::npos) << text;
  const json j = json::parse(analysis_json({a}));
  const json& jr = j["traces"][0]["replay"];
  ASSERT_TRUE(jr.is_object()) << j.dump(1);
  EXPECT_EQ(jr["problems"].size(), 1u);
  EXPECT_EQ(jr["problems"][0]["fastest"], p.fastest);
  EXPECT_EQ(jr["problems"][0]["problem"]["seq"], 128);
}

TEST(Replay, OnlyTheBackendsAsked) {
  TraceAnalysis a = analyze_traces({fixture("cpu_math")}).at(0);
  ReplayOptions o = quick();
  o.backends = {"flash"};
  replay_attention(a, o);
  ASSERT_EQ(a.replay->problems.size(), 1u);
  const auto& runs = a.replay->problems[0].runs;
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].backend, "flash");
  EXPECT_EQ(a.replay->problems[0].fastest, "flash");
}

TEST(Replay, CudaTraceWithoutTheDeviceSaysSoAndRunsOnlyWhenAsked) {
  TraceAnalysis a = analyze_traces({fixture("cuda_train")}).at(0);
  replay_attention(a, quick());
  ASSERT_TRUE(a.replay);
  EXPECT_EQ(a.replay->trace_device, "cuda");
  if (cuda_here()) {
    // A GPU here: the trace's own device, no note, flash run on both passes.
    EXPECT_EQ(a.replay->device, "cuda");
    EXPECT_TRUE(a.replay->note.empty()) << a.replay->note;
    ASSERT_EQ(a.replay->problems.size(), 2u);
    for (const auto& p : a.replay->problems) {
      const ReplayRun* flash = run_of(p, "flash");
      ASSERT_NE(flash, nullptr) << p.label;
      EXPECT_TRUE(flash->ran) << p.label << ": " << flash->note;
    }
    return;
  }
  EXPECT_TRUE(a.replay->device.empty());
  EXPECT_NE(a.replay->note.find("device=cpu"), std::string::npos) << a.replay->note;
  ASSERT_EQ(a.replay->problems.size(), 2u) << "the flash forward and its backward";
  EXPECT_EQ(a.replay->problems[0].label, "forward 2x4x256x64 causal bf16");
  EXPECT_EQ(a.replay->problems[1].label, "backward 2x4x256x64 causal bf16");
  for (const auto& p : a.replay->problems) {
    EXPECT_TRUE(p.runs.empty()) << p.label;
    EXPECT_FALSE(p.skipped.empty()) << p.label;
  }
  // Asked for the GPU that is not here: one line, nothing run.
  TraceAnalysis b = analyze_traces({fixture("cuda_train")}).at(0);
  replay_attention(b, quick(Device::Cuda));
  EXPECT_NE(b.replay->note.find("replay on cuda asked, but it is not here"), std::string::npos) << b.replay->note;
  for (const auto& p : b.replay->problems) EXPECT_TRUE(p.runs.empty());
}

TEST(Replay, CudaTraceOnTheCpuWhenAskedIsLabelled) {
  TraceAnalysis a = analyze_traces({fixture("cuda_train")}).at(0);
  ReplayOptions o = quick(Device::Cpu);
  o.backends = {"flash"};
  replay_attention(a, o);
  EXPECT_EQ(a.replay->device, "cpu");
  EXPECT_NE(a.replay->note.find("replayed on cpu; the trace ran on cuda"), std::string::npos) << a.replay->note;
  ASSERT_EQ(a.replay->problems.size(), 2u);
  const ReplayProblem& bwd = a.replay->problems[1];
  ASSERT_TRUE(bwd.problem);
  EXPECT_EQ(bwd.problem->pass, Pass::Backward);
  const ReplayRun* flash = run_of(bwd, "flash");
  ASSERT_NE(flash, nullptr);
  EXPECT_TRUE(flash->ran) << flash->note;
}

// A CPU trace made by hand: SDPA calls with the record_shapes columns.
Activity sdpa(std::int64_t start_us, const std::string& q) {
  Activity a;
  a.type = ActivityType::CpuOp;
  a.name = "aten::scaled_dot_product_attention";
  a.start_ns = start_us * 1000;
  a.dur_ns = 100'000;
  a.input_dims = q + ", " + q + ", " + q + ", [], [], [], [], []";
  a.input_dtypes = "float, float, float, , Scalar, Scalar, , Scalar";
  a.concrete_inputs = {"", "", "", "", "0.", "True", "", "False"};
  return a;
}

TEST(Replay, HostileShapesAreOneLineEachAndQuick) {
  Trace t;
  t.activities.push_back(sdpa(0, "[1, 2, 1000000000000, 64]"));           // seq = 10^12, causal
  t.activities.push_back(sdpa(200, "[1, -2, 128, 64]"));                  // a negative head count
  t.activities.push_back(sdpa(400, "[1, 2, 128, 512]"));                  // head_dim no backend takes
  t.activities.push_back(sdpa(600, "[8, 32, 4096, 128]"));                // runnable, but 2.2 TFLOP a call
  t.activities.push_back(sdpa(800, "[99999999999999999999, 2, 16, 8]"));  // past int64
  const auto t0 = std::chrono::steady_clock::now();
  TraceAnalysis a = analyze_trace(t, "hostile.json");
  ASSERT_EQ(a.steps.size(), 1u);
  const auto& calls = a.steps[0].attention.calls;
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_FALSE(calls[0].flops) << "10^12 query rows are not walked";
  EXPECT_NE(calls[0].refused.find("seq"), std::string::npos) << calls[0].refused;
  EXPECT_FALSE(calls[1].flops);
  EXPECT_NE(calls[1].refused.find("heads"), std::string::npos) << calls[1].refused;
  ASSERT_TRUE(calls[2].flops) << "FLOPs count for a head_dim nothing runs";
  EXPECT_DOUBLE_EQ(*calls[2].flops, 4.0 * 2 * (128.0 * 129 / 2) * 512);
  EXPECT_NE(calls[2].refused.find("head_dim"), std::string::npos) << calls[2].refused;
  EXPECT_TRUE(calls[3].refused.empty()) << calls[3].refused;
  replay_attention(a, quick(Device::Cpu));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 10) << "nothing hostile runs";
  const auto& ps = a.replay->problems;
  ASSERT_EQ(ps.size(), 5u);
  for (const auto& p : ps) {
    EXPECT_TRUE(p.runs.empty()) << p.label;
    EXPECT_FALSE(p.skipped.empty()) << p.label;
    EXPECT_EQ(p.skipped.find('\n'), std::string::npos) << p.skipped;
  }
  EXPECT_NE(ps[0].skipped.find("not replayed: seq"), std::string::npos) << ps[0].skipped;
  EXPECT_NE(ps[3].skipped.find("above the CPU replay's cap"), std::string::npos) << ps[3].skipped;
  // The report still prints, every skipped problem on its line.
  const std::string text = analysis_text(a);
  EXPECT_NE(text.find(ps[3].skipped), std::string::npos) << text;
  EXPECT_TRUE(json::accept(analysis_json({a})));
}

TEST(Replay, BlockMasksAndMissingShapesAreNotReplayed) {
  Trace t;
  Activity flex;
  flex.type = ActivityType::CpuOp;
  flex.name = "flex_attention";
  flex.dur_ns = 50'000;
  flex.input_dims = "[1, 2, 64, 32], [1, 2, 64, 32], [1, 2, 64, 32]";
  flex.input_dtypes = "float, float, float";
  t.activities.push_back(flex);
  Activity bare = sdpa(200, "[1, 2, 64, 32]");
  bare.input_dims.clear();
  t.activities.push_back(bare);
  TraceAnalysis a = analyze_trace(t, "flex.json");
  replay_attention(a, quick(Device::Cpu));
  const auto& ps = a.replay->problems;
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_NE(ps[0].skipped.find("block mask"), std::string::npos) << ps[0].skipped;
  EXPECT_NE(ps[1].skipped.find("record_shapes=True"), std::string::npos) << ps[1].skipped;
}

// ---- the command ---------------------------------------------------------------------

struct Cli {
  int code = -1;
  std::string out, err;
};

Cli cli(const std::string& args, const testing::TempDir& io) {
  const std::string out = io.str(".out"), err = io.str(".err");
  const std::string cmd = std::string(ATTNPROF_CLI_PATH) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), testing::slurp(out), testing::slurp(err)};
}

TEST(Replay, TheCommandPrintsAndWritesIt) {
  testing::TempDir io;
  const Cli r =
      cli("analyze " + fixture("cpu_math") + " --replay --backends flash,math --json " + io.str("a.json"), io);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("replay on cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fastest: "), std::string::npos) << r.out;
  const json j = json::parse(testing::slurp(io.str("a.json")));
  EXPECT_EQ(j["traces"][0]["replay"]["problems"][0]["runs"].size(), 2u);
}

TEST(Replay, TheCommandRefusesBadFlagsInOneLine) {
  testing::TempDir io;
  for (const std::string& args :
       {std::string("--device cpu"), std::string("--replay --device gpu"),
        std::string("--replay --replay-max-gflop -1"), std::string("--replay --backends nosuch")}) {
    const Cli r = cli("analyze " + fixture("cpu_math") + " " + args, io);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("attnprof: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// issue 49 item 14: a positive number past a real flag's bound is told the
// bound, not that it must be positive.
TEST(Replay, ARealFlagPastItsBoundSaysTheBound) {
  testing::TempDir io;
  const Cli gflop = cli("analyze " + fixture("cpu_math") + " --replay --replay-max-gflop 1000000000000", io);
  EXPECT_EQ(gflop.code, 2) << gflop.err;
  EXPECT_NE(gflop.err.find("--replay-max-gflop must be above 0 and at most 1e+09 GFLOP, got 1000000000000"),
            std::string::npos)
      << gflop.err;
  const Cli tflops = cli("analyze " + fixture("cpu_math") + " --ceiling-tflops 2e6", io);
  EXPECT_EQ(tflops.code, 2) << tflops.err;
  EXPECT_NE(tflops.err.find("--ceiling-tflops must be above 0 and at most 1e+06 TFLOP/s, got 2e6"), std::string::npos)
      << tflops.err;
  const Cli text = cli("analyze " + fixture("cpu_math") + " --ceiling-tflops 0x10", io);
  EXPECT_NE(text.err.find("--ceiling-tflops expects a decimal number"), std::string::npos) << text.err;
}

// Every attention call's (tflops, ceiling_pct) in an analyze JSON, wherever it sits.
void attention_calls_in(const json& j, std::vector<std::pair<json, json>>& out) {
  if (j.is_object()) {
    if (j.contains("ceiling_pct") && j.contains("tflops") && j.contains("share_pct")) {
      out.emplace_back(j["tflops"], j["ceiling_pct"]);
    }
    for (const auto& [key, v] : j.items()) attention_calls_in(v, out);
  } else if (j.is_array()) {
    for (const auto& v : j) attention_calls_in(v, out);
  }
}

TEST(Replay, TheCeilingFlagGivesEveryAttentionCallItsShareOfTheRoof) {
  testing::TempDir io;
  const Cli with = cli("analyze " + fixture("cpu_math") + " --ceiling-tflops 0.5 --json " + io.str("c.json"), io);
  ASSERT_EQ(with.code, 0) << with.err;
  std::vector<std::pair<json, json>> calls;
  attention_calls_in(json::parse(testing::slurp(io.str("c.json"))), calls);
  ASSERT_FALSE(calls.empty());
  for (const auto& [tflops, pct] : calls) {
    ASSERT_TRUE(tflops.is_number() && pct.is_number()) << tflops << " " << pct;
    EXPECT_NEAR(pct.get<double>(), 100.0 * tflops.get<double>() / 0.5, 1e-9 + 1e-9 * pct.get<double>());
  }
  ::unsetenv("ATTNPROF_CEILING_TFLOPS");  // nor from the environment: no column
  const Cli without = cli("analyze " + fixture("cpu_math") + " --json " + io.str("n.json"), io);
  ASSERT_EQ(without.code, 0) << without.err;
  calls.clear();
  attention_calls_in(json::parse(testing::slurp(io.str("n.json"))), calls);
  ASSERT_FALSE(calls.empty());
  for (const auto& [tflops, pct] : calls) EXPECT_TRUE(pct.is_null()) << pct;
  const Cli bad = cli("analyze " + fixture("cpu_math") + " --ceiling-tflops 0", io);
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

}  // namespace
}  // namespace attnprof
