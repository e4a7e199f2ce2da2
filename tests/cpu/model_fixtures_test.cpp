// The attention table on traces of a real model: transformers' LlamaForCausalLM
// (random weights, scripts/record_model_traces.py; tests/fixtures/models/) through
// SDPA, SDPA's math, transformers' eager decomposition and attnprof, a forward
// and a training step each, against a hand count: the calls from the model's
// config (one per layer and pass), the FLOPs from its shapes, the ops counted
// in the JSON itself.
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "attnprof/analyze.h"
#include "attnprof/replay.h"
#include "attnprof/report.h"

namespace attnprof {
namespace {

using nlohmann::json;

const std::string kDir = std::string(ATTNPROF_TORCH_FIXTURES) + "/../models";

json meta() {
  std::ifstream f(kDir + "/model_traces.json");
  EXPECT_TRUE(f.good()) << kDir;
  return json::parse(f);
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

// cpu_op events named `name` inside the trace's recorded step, by hand.
int ops_named(const json& trace, const std::string& name) {
  int n = 0;
  for (const auto& e : trace["traceEvents"]) n += e.value("cat", "") == "cpu_op" && e.value("name", "") == name;
  return n;
}

struct Expect {
  const char* trace;       // key in model_traces.json
  const char* op;          // the outermost op of a forward call, as the JSON names it; "" none
  const char* backend;     // what the table says ran
  int backward_per_layer;  // backward calls per layer (0: the math decomposition's backward is autograd's)
  bool flops;              // the mask is in the trace (attnprof's: its Python front end's label, torch keeping
                           // no string argument)
};

void PrintTo(const Expect& e, std::ostream* os) { *os << e.trace; }

class ModelFixtures : public ::testing::TestWithParam<Expect> {};

TEST_P(ModelFixtures, AttentionTableMatchesAHandCount) {
  const Expect& x = GetParam();
  const json m = meta();
  const json& c = m["config"];
  const std::string name = m["traces"][x.trace].get<std::string>();
  const std::string path = kDir + "/" + name;
  const TraceAnalysis a = analyze_traces({path}).at(0);
  ASSERT_EQ(a.steps.size(), 1u) << "schedule(wait=0, warmup=1, active=1)";
  const AttentionSummary& s = a.steps[0].attention;

  const int layers = c["num_hidden_layers"];
  const double b = m["batch"], h = c["num_attention_heads"], hkv = c["num_key_value_heads"], d = c["head_dim"];
  const double seq = m["seq"];
  const bool train = std::string(x.trace).ends_with("_train");
  const int forward = std::string(x.op).empty() ? 0 : layers;
  const int backward = train ? x.backward_per_layer * layers : 0;
  ASSERT_EQ(s.calls.size(), static_cast<std::size_t>(forward + backward)) << analysis_text(a);
  if (forward > 0) EXPECT_EQ(ops_named(read_gz(path), x.op), forward) << "the JSON's own count of " << x.op;

  // Causal over S = Skv: S (S + 1) / 2 visible pairs per head; a backward 2.5x.
  const double fwd_flops = 4 * b * h * (seq * (seq + 1) / 2) * d;
  const std::string shape = std::to_string(int(b)) + "x" + std::to_string(int(h)) + "x" + std::to_string(int(seq)) +
                            "x" + std::to_string(int(d)) + ", kv " + std::to_string(int(b)) + "x" +
                            std::to_string(int(hkv)) + "x" + std::to_string(int(seq)) + "x" + std::to_string(int(d));
  int fwd = 0, bwd = 0;
  for (const AttentionCall& call : s.calls) {
    (call.backward ? bwd : fwd)++;
    EXPECT_EQ(call.backend, x.backend) << call.op;
    EXPECT_EQ(call.shape, shape) << call.op << ": grouped-query K and V, as the config has them";
    EXPECT_EQ(call.dtype, "fp32");
    if (x.flops) {
      EXPECT_EQ(call.mask, "causal") << call.op;
      ASSERT_TRUE(call.flops) << call.op;
      EXPECT_DOUBLE_EQ(*call.flops, call.backward ? 2.5 * fwd_flops : fwd_flops) << call.op;
      ASSERT_TRUE(call.tflops);
      EXPECT_NEAR(*call.tflops, *call.flops / (call.cpu_us * 1e-6) / 1e12, 1e-9 * *call.tflops);
    } else {
      EXPECT_EQ(call.mask, "unknown") << "PyTorch records no string argument: the mask is not in the trace";
      EXPECT_FALSE(call.flops);
    }
    EXPECT_GT(call.cpu_us, 0);
    EXPECT_TRUE(call.refused.empty()) << call.refused;
  }
  EXPECT_EQ(fwd, forward);
  EXPECT_EQ(bwd, backward);
  if (!s.calls.empty()) {
    ASSERT_TRUE(s.forward_pct);
    EXPECT_GT(*s.forward_pct, 0);
    EXPECT_LT(*s.forward_pct + *s.backward_pct, 100);
  }
  EXPECT_TRUE(s.missing_shapes.empty()) << "record_shapes=True";
}

INSTANTIATE_TEST_SUITE_P(Llama, ModelFixtures,
                         ::testing::Values(
                             // SDPA on the CPU dispatches to its flash kernel, forward and backward.
                             Expect{"sdpa_forward", "aten::scaled_dot_product_attention", "flash", 0, true},
                             Expect{"sdpa_train", "aten::scaled_dot_product_attention", "flash", 1, true},
                             // SDPA held to its math decomposition: the backward is autograd's, op by op.
                             Expect{"sdpa_math_forward", "aten::scaled_dot_product_attention", "math", 0, true},
                             Expect{"sdpa_math_train", "aten::scaled_dot_product_attention", "math", 0, true},
                             // transformers' eager attention is matmuls and a softmax: no op names attention.
                             Expect{"eager_forward", "", "", 0, true}, Expect{"eager_train", "", "", 0, true},
                             // attnprof through transformers' AttentionInterface: its custom ops, train and
                             // backward, each inside the range naming its backend and mask.
                             Expect{"attnprof_forward", "attnprof::attention", "attnprof:flash", 0, true},
                             Expect{"attnprof_train", "attnprof::attention_train", "attnprof:flash", 1, true}),
                         [](const auto& info) { return std::string(info.param.trace); });

TEST(ModelFixtures, TrainingStepReplaysItsForwardAndBackward) {
  TraceAnalysis a = analyze_traces({kDir + "/" + meta()["traces"]["sdpa_train"].get<std::string>()}).at(0);
  ReplayOptions o;
  o.backends = {"flash", "math"};
  o.run.threads = 2;
  replay_attention(a, o);
  ASSERT_TRUE(a.replay);
  EXPECT_EQ(a.replay->device, "cpu");
  ASSERT_EQ(a.replay->problems.size(), 2u) << "every layer's call is one problem, forward and backward";
  EXPECT_EQ(a.replay->problems[0].label, "forward 1x4x32x16, kv 1x2x32x16 causal fp32");
  EXPECT_EQ(a.replay->problems[1].label, "backward 1x4x32x16, kv 1x2x32x16 causal fp32");
  for (const ReplayProblem& p : a.replay->problems) {
    EXPECT_EQ(p.calls, 2) << p.label << ": one per layer";
    EXPECT_EQ(p.ran, "flash");
    ASSERT_EQ(p.runs.size(), 2u);
    for (const ReplayRun& r : p.runs) EXPECT_TRUE(r.ran) << p.label << " " << r.backend << ": " << r.note;
    EXPECT_FALSE(p.fastest.empty());
  }
}

}  // namespace
}  // namespace attnprof
