// The CPU flash backward (flash_backward.cpp) against the float64 gradient
// reference: dQ, dK and dV for every structural mask, grouped-query heads,
// head dims 32..256, fully masked rows, thread counts, and through the runner
// for --pass backward and train. Gradients start poisoned with NaN, so a row
// the backward forgets to write fails loudly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cpu/cpu_backends.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using testing::Shape;

Problem make_problem(const Shape& s, DType dtype, MaskKind mask, Pass pass = Pass::Backward) {
  Problem p = testing::to_problem(s, dtype, mask);
  p.pass = pass;
  p.validate();
  return p;
}

// One training step of flash: forward_train, then backward.
struct Step {
  Inputs in;
  Tensor out, dout;
  Saved saved;
  Gradients grads;
};

Step run_flash(const Problem& p, int threads, std::uint64_t seed = 7) {
  auto flash = cpu::make_flash();
  Step s;
  s.in = make_inputs(p, seed, cpu_allocator());
  s.dout = make_dout(p, seed, cpu_allocator());
  s.out = testing::nan_tensor(p, p.heads, p.seq);
  s.grads = {testing::nan_tensor(p, p.heads, p.seq), testing::nan_tensor(p, p.kv_heads, p.kv_seq),
             testing::nan_tensor(p, p.kv_heads, p.kv_seq)};
  RunContext ctx{.allocator = cpu_allocator(), .threads = threads};
  flash->forward_train(p, s.in, s.out, s.saved, ctx);
  flash->backward(p, s.in, s.out, s.dout, s.saved, s.grads, ctx);
  return s;
}

GradientErrors errors_of(const Problem& p, const Step& s) {
  return check_gradients_against_reference(p, s.in, s.dout, s.grads, sample_rows(p, 1 << 20),
                                           sample_kv_rows(p, 1 << 20));
}

// FP32 far under 1e-4; 16-bit by accept() (no math run to compare with here).
void expect_accurate(const Problem& p, const GradientErrors& e, const std::string& what) {
  const char* names[] = {"dQ", "dK", "dV"};
  int k = 0;
  for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
    const char* name = names[k++];
    EXPECT_EQ(s->nan_rows, 0) << what << " " << name;
    if (p.dtype == DType::F32) {
      EXPECT_LT(s->rel, 1e-5) << what << " " << name;
    } else {
      const Acceptance a = accept(p.dtype, *s, std::nullopt, false);
      EXPECT_TRUE(a.pass) << what << " " << name << ": " << a.why;
    }
  }
}

struct Case {
  const char* name;
  Shape shape;
  DType dtype;
  MaskKind mask;
};

class FlashBackward : public ::testing::TestWithParam<Case> {};

TEST_P(FlashBackward, MatchesFloat64Gradients) {
  const Case& c = GetParam();
  const Problem p = make_problem(c.shape, c.dtype, c.mask);
  const Step s = run_flash(p, 2);
  expect_accurate(p, errors_of(p, s), c.name);
}

INSTANTIATE_TEST_SUITE_P(
    MasksShapesDtypes, FlashBackward,
    ::testing::Values(
        Case{"none", {.batch = 2, .heads = 2, .seq = 130, .kv_seq = 200, .head_dim = 64}, DType::F32, MaskKind::None},
        Case{"causal", {.heads = 3, .seq = 150, .head_dim = 32}, DType::F32, MaskKind::Causal},
        Case{"causal_kv_longer", {.heads = 2, .seq = 70, .kv_seq = 200, .head_dim = 64}, DType::F32, MaskKind::Causal},
        Case{"bottom_right_kv_longer",
             {.heads = 2, .seq = 100, .kv_seq = 230, .head_dim = 64},
             DType::F32,
             MaskKind::CausalBottomRight},
        Case{"bottom_right_kv_shorter",
             {.heads = 2, .seq = 200, .kv_seq = 90, .head_dim = 48},
             DType::F32,
             MaskKind::CausalBottomRight},
        Case{"window", {.heads = 2, .seq = 300, .head_dim = 128, .window = 70}, DType::F32, MaskKind::SlidingWindow},
        Case{"window_kv_longer",
             {.heads = 1, .seq = 90, .kv_seq = 260, .head_dim = 64, .window = 100},
             DType::F32,
             MaskKind::SlidingWindow},
        Case{"gqa_causal", {.heads = 8, .kv_heads = 2, .seq = 140, .head_dim = 64}, DType::F32, MaskKind::Causal},
        Case{"mqa_none",
             {.heads = 4, .kv_heads = 1, .seq = 66, .kv_seq = 129, .head_dim = 32},
             DType::F32,
             MaskKind::None},
        Case{"hdim96", {.heads = 2, .seq = 100, .head_dim = 96}, DType::F32, MaskKind::Causal},
        Case{"hdim256", {.heads = 1, .seq = 80, .kv_seq = 150, .head_dim = 256}, DType::F32, MaskKind::None},
        Case{"hdim_odd", {.heads = 1, .seq = 33, .kv_seq = 47, .head_dim = 5}, DType::F32, MaskKind::Causal},
        Case{"scale", {.heads = 2, .seq = 64, .head_dim = 64, .scale = 0.3}, DType::F32, MaskKind::Causal},
        Case{"bias", {.heads = 2, .seq = 100, .kv_seq = 120, .head_dim = 64}, DType::F32, MaskKind::Bias},
        Case{"boolean", {.heads = 2, .seq = 100, .kv_seq = 120, .head_dim = 64}, DType::F32, MaskKind::Boolean},
        Case{"bf16_causal", {.batch = 2, .heads = 2, .seq = 200, .head_dim = 64}, DType::BF16, MaskKind::Causal},
        Case{"bf16_gqa_hdim128",
             {.heads = 4, .kv_heads = 2, .seq = 130, .head_dim = 128},
             DType::BF16,
             MaskKind::CausalBottomRight},
        Case{"f16_none", {.heads = 2, .seq = 100, .kv_seq = 170, .head_dim = 64}, DType::F16, MaskKind::None}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(FlashBackward, SavedLseIsTheNaturalLogSumExp) {
  const Problem p =
      make_problem({.heads = 2, .seq = 70, .kv_seq = 40, .head_dim = 16}, DType::F32, MaskKind::CausalBottomRight);
  const Step s = run_flash(p, 2);
  ASSERT_EQ(s.saved.lse.sizes(), (Dims{p.batch, p.heads, p.seq, 1}));
  EXPECT_FALSE(s.saved.probs.defined());
  for (std::int64_t h = 0; h < p.heads; ++h) {
    for (std::int64_t i = 0; i < p.seq; ++i) {
      double mx = -INFINITY;
      std::vector<double> x;
      for (std::int64_t j = 0; j < p.kv_seq; ++j) {
        if (!p.visible(i, j)) continue;
        double dot = 0;
        for (std::int64_t d = 0; d < p.head_dim; ++d) dot += s.in.q.get(0, h, i, d) * s.in.k.get(0, h, j, d);
        x.push_back(dot * p.softmax_scale());
        mx = std::max(mx, x.back());
      }
      const float got = s.saved.lse.get(0, h, i, 0);
      if (x.empty()) {
        EXPECT_EQ(got, -INFINITY) << "row " << i << " sees no key";
        continue;
      }
      double sum = 0;
      for (double v : x) sum += std::exp(v - mx);
      EXPECT_NEAR(got, mx + std::log(sum), 1e-5) << "head " << h << " row " << i;
    }
  }
}

TEST(FlashBackward, FullyMaskedRowsAndUnseenKeysHaveZeroGradients) {
  // Bottom-right with 60 more queries than keys: queries 0..59 see no key.
  const Problem p =
      make_problem({.heads = 2, .seq = 100, .kv_seq = 40, .head_dim = 32}, DType::F32, MaskKind::CausalBottomRight);
  const Step s = run_flash(p, 2);
  for (std::int64_t h = 0; h < p.heads; ++h)
    for (std::int64_t i = 0; i < 60; ++i)
      for (std::int64_t d = 0; d < p.head_dim; ++d) ASSERT_EQ(s.grads.dq.get(0, h, i, d), 0.0f) << i;
  expect_accurate(p, errors_of(p, s), "fully masked rows");

  // Top-left causal with more keys than queries: keys past the last query are never seen.
  const Problem q = make_problem({.heads = 1, .seq = 50, .kv_seq = 150, .head_dim = 32}, DType::F32, MaskKind::Causal);
  const Step t = run_flash(q, 2);
  for (std::int64_t j = 50; j < 150; ++j) {
    for (std::int64_t d = 0; d < q.head_dim; ++d) {
      ASSERT_EQ(t.grads.dk.get(0, 0, j, d), 0.0f) << j;
      ASSERT_EQ(t.grads.dv.get(0, 0, j, d), 0.0f) << j;
    }
  }
  expect_accurate(q, errors_of(q, t), "unseen keys");
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  testing::for_each_index(a, [&](auto i, auto j, auto k, auto l) {
    worst = std::max(worst, std::abs(static_cast<double>(a.get(i, j, k, l)) - b.get(i, j, k, l)));
  });
  return worst;
}

TEST(FlashBackward, ThreadCountsGiveCloseResults) {
  const Problem p =
      make_problem({.batch = 2, .heads = 4, .kv_heads = 2, .seq = 300, .head_dim = 64}, DType::F32, MaskKind::Causal);
  const Step one = run_flash(p, 1);
  const Step two = run_flash(p, 2);
  // dK and dV are summed by one item each, in the same order whatever the
  // threads; dQ's key-block contributions arrive in thread order.
  EXPECT_EQ(max_abs_diff(one.grads.dk, two.grads.dk), 0.0);
  EXPECT_EQ(max_abs_diff(one.grads.dv, two.grads.dv), 0.0);
  EXPECT_LT(max_abs_diff(one.grads.dq, two.grads.dq), 1e-5);
}

TEST(FlashBackward, DeterministicIsBitwiseRepeatableAcrossThreadCounts) {
  Problem p = make_problem({.heads = 2, .seq = 400, .head_dim = 64}, DType::F32, MaskKind::None);
  p.deterministic = true;
  const Step one = run_flash(p, 1);
  const Step two = run_flash(p, 2);
  EXPECT_EQ(max_abs_diff(one.grads.dq, two.grads.dq), 0.0);
  expect_accurate(p, errors_of(p, two), "deterministic");
}

TEST(FlashBackward, EligibilityExpectationWorkspace) {
  auto flash = cpu::make_flash();
  EXPECT_TRUE(flash->has_backward());
  Problem p = make_problem({.heads = 2, .seq = 1024, .head_dim = 64}, DType::BF16, MaskKind::Causal);
  const Eligibility e = eligibility_of(*flash, p);
  EXPECT_TRUE(e.eligible) << e.reason;
  EXPECT_NE(e.reason.find("backward"), std::string::npos) << e.reason;
  EXPECT_EQ(flash->expectation(p).cpu_ops, std::vector<std::string>{"flash_attention_backward"});
  p.pass = Pass::Train;
  EXPECT_EQ(flash->expectation(p).cpu_ops, (std::vector<std::string>{"flash_attention", "flash_attention_backward"}));

  // Linear in the sequence: doubling it at most doubles the workspace.
  Problem longer = p;
  longer.seq = longer.kv_seq = 2048;
  EXPECT_LE(flash->workspace_bytes(longer), 2 * flash->workspace_bytes(p));
  Problem forward = p;
  forward.pass = Pass::Forward;
  EXPECT_GT(flash->workspace_bytes(p), flash->workspace_bytes(forward));

  // What one step allocates stays within what workspace_bytes() declares,
  // and far under one [S, Skv] score matrix.
  Allocator& a = cpu_allocator();
  a.reset_peak();
  const std::int64_t before = a.stats().allocated;
  {
    auto fl = cpu::make_flash();
    Step s;
    s.in = make_inputs(p, 1, a);
    s.dout = make_dout(p, 1, a);
    s.out = testing::nan_tensor(p, p.heads, p.seq);
    s.grads = {testing::nan_tensor(p, p.heads, p.seq), testing::nan_tensor(p, p.kv_heads, p.kv_seq),
               testing::nan_tensor(p, p.kv_heads, p.kv_seq)};
    const std::int64_t tensors = a.stats().allocated;
    RunContext ctx{.allocator = a, .threads = 0};
    fl->forward_train(p, s.in, s.out, s.saved, ctx);
    fl->backward(p, s.in, s.out, s.dout, s.saved, s.grads, ctx);
    const std::int64_t extra = a.stats().peak_allocated - tensors;
    EXPECT_LE(extra, static_cast<std::int64_t>(flash->workspace_bytes(p)));
    EXPECT_LT(extra, p.seq * p.kv_seq * 4);
  }
  EXPECT_EQ(a.stats().allocated, before);
}

RunOptions quick(int threads) {
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  o.check_rows = 256;
  o.threads = threads;
  return o;
}

TEST(FlashBackward, RunBackendBackwardAndTrain) {
  auto flash = cpu::make_flash();
  for (Pass pass : {Pass::Backward, Pass::Train}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      const Problem p = make_problem({.batch = 2, .heads = 4, .kv_heads = 2, .seq = 256, .head_dim = 64}, dtype,
                                     MaskKind::Causal, pass);
      const RunResult r = run_backend(*flash, p, quick(2));
      const std::string what = std::string(pass_name(pass)) + " " + std::string(dtype_name(dtype));
      ASSERT_FALSE(r.failure) << what << ": " << *r.failure;
      ASSERT_TRUE(r.acceptance && r.acceptance->pass) << what << ": " << (r.acceptance ? r.acceptance->why : "none");
      ASSERT_TRUE(r.gradient_errors) << what;
      ASSERT_TRUE(r.metrics.saved_bytes) << what;
      EXPECT_EQ(*r.metrics.saved_bytes, static_cast<double>(p.batch * p.heads * p.seq * 4)) << what;
      EXPECT_EQ(r.metrics.ops_per_forward, static_cast<double>(r.expectation.cpu_ops.size())) << what;
    }
  }
}

}  // namespace
}  // namespace attnprof
