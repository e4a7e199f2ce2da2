// The fused backward (kernels/flash_bwd_sm80.cuh, behind efficient and flash):
// dQ, dK and dV against the float64 gradient reference on fresh random inputs
// with NaN-poisoned gradients, across masks, kv_seq != seq, grouped-query
// heads, [B, S, H, D] views, head dims and both 16-bit types; fully masked
// rows and unseen keys give zero gradients; deterministic mode is bitwise
// repeatable; the backward's eligibility and declared kernel count.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "common/test_problem.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

std::unique_ptr<Backend> make(const std::string& name) {
  return name == "flash" ? cuda::make_flash() : cuda::make_efficient();
}

// forward_train then backward on fresh device copies, gradients NaN-poisoned
// first; returns dQ, dK, dV on the host.
Gradients run_backward(Backend& b, const Problem& p, const Inputs& host, const Tensor& host_dout) {
  DeviceRuntime& rt = cuda::runtime();
  const Inputs in = rt.upload(host);
  const Tensor dout = rt.upload(host_dout);
  Allocator& alloc = rt.allocator();
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, alloc);
  rt.poison(out);
  RunContext ctx{alloc, rt.stream(), 0};
  Saved saved;
  b.forward_train(p, in, out, saved, ctx);
  Gradients g{Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, alloc),
              Tensor::empty({p.batch, p.kv_heads, p.kv_seq, p.head_dim}, p.dtype, alloc),
              Tensor::empty({p.batch, p.kv_heads, p.kv_seq, p.head_dim}, p.dtype, alloc)};
  rt.poison(g.dq);
  rt.poison(g.dk);
  rt.poison(g.dv);
  b.backward(p, in, out, dout, saved, g, ctx);
  rt.synchronize();
  return {rt.download(g.dq), rt.download(g.dk), rt.download(g.dv)};
}

struct Case {
  std::string backend;
  DType dtype;
  std::int64_t head_dim;
  MaskKind mask;
  std::int64_t seq, kv_seq, heads, kv_heads, window;
  bool bshd;
  bool deterministic;
  std::string label;
  std::int64_t batch = 2;
  std::optional<double> scale{};
};

Problem problem_of(const Case& c) {
  Problem p = testing::to_problem(c, c.dtype, c.mask, Device::Cuda);
  p.pass = Pass::Backward;
  p.deterministic = c.deterministic;
  p.validate();
  return p;
}

std::vector<Case> cases() {
  struct Shape {
    MaskKind mask;
    std::int64_t seq, kv_seq, heads, kv_heads, window;
    bool bshd;
    const char* label;
  };
  const Shape shapes[] = {
      {MaskKind::None, 128, 128, 4, 4, 0, false, "none"},
      {MaskKind::Causal, 160, 160, 4, 4, 0, false, "causal_s160"},
      {MaskKind::CausalBottomRight, 96, 160, 4, 4, 0, false, "causal_br_q96_kv160"},
      {MaskKind::CausalBottomRight, 200, 130, 2, 2, 0, false, "causal_br_q200_kv130"},
      {MaskKind::SlidingWindow, 128, 160, 4, 4, 32, false, "window32_kv160"},
      {MaskKind::Causal, 128, 128, 4, 2, 0, false, "causal_gqa2"},
      {MaskKind::Causal, 128, 192, 4, 1, 0, true, "causal_mqa_bshd"},
      {MaskKind::None, 64, 100, 4, 2, 0, true, "none_gqa_bshd_kv100"},
  };
  std::vector<Case> out;
  for (DType t : {DType::BF16, DType::F16}) {
    for (std::int64_t d : {64, 128}) {
      for (const Shape& s : shapes) {
        out.push_back({"flash", t, d, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, false,
                       "flash_" + std::string(dtype_name(t)) + "_d" + std::to_string(d) + "_" + s.label});
      }
    }
  }
  // The other head dims, efficient's forward feeding the same backward, and
  // the deterministic dQ kernel on every mask.
  for (std::int64_t d : {32, 96}) {  // 96: padded to 128 in the sm90 kernel
    for (const Shape& s : {shapes[1], shapes[4], shapes[6]}) {
      out.push_back({"flash", DType::BF16, d, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, false,
                     "flash_bf16_d" + std::to_string(d) + "_" + s.label});
    }
  }
  for (const Shape& s : {shapes[2], shapes[4], shapes[5]}) {
    out.push_back({"efficient", DType::F16, 64, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, false,
                   std::string("efficient_fp16_d64_") + s.label});
  }
  for (const Shape& s : shapes) {
    out.push_back({"flash", DType::BF16, 128, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, true,
                   std::string("flash_bf16_d128_deterministic_") + s.label});
  }
  // Head dims 192 and 256: the sm90 kernel's wide tiles (64 keys, both
  // consumers on them; flash on sm90 only), every mask, grouped and
  // multi-query heads, both dtypes, ordered dQ.
  for (std::int64_t d : {192, 256}) {
    for (const Shape& s : {shapes[0], shapes[1], shapes[3], shapes[4], shapes[6], shapes[7]}) {
      out.push_back({"flash", DType::BF16, d, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, false,
                     "flash_bf16_d" + std::to_string(d) + "_" + s.label});
    }
    for (const Shape& s : {shapes[2], shapes[5]}) {
      out.push_back({"flash", DType::F16, d, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, false,
                     "flash_fp16_d" + std::to_string(d) + "_" + s.label});
      out.push_back({"flash", DType::BF16, d, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, true,
                     "flash_bf16_d" + std::to_string(d) + "_deterministic_" + s.label});
    }
  }
  // Grouped-query heads on enough key tiles and heads that each CTA keeps its
  // whole group (flash_sm90_bwd_group_split gives 1 at batch 2; the small
  // shapes above split theirs), plain and ordered.
  for (const bool deterministic : {false, true}) {
    out.push_back({"flash", DType::BF16, 64, MaskKind::Causal, 200, 200, 136, 68, 0, false, deterministic,
                   std::string("flash_bf16_d64_causal_gqa_unsplit") + (deterministic ? "_deterministic" : "")});
  }
  // The sm90 kernel's other tiles in ordered dQ, and fp16 at head dim 96.
  for (const Shape& s : {shapes[3], shapes[4], shapes[6]}) {
    out.push_back({"flash", DType::F16, 64, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, true,
                   std::string("flash_fp16_d64_deterministic_") + s.label});
    out.push_back({"flash", DType::F16, 96, s.mask, s.seq, s.kv_seq, s.heads, s.kv_heads, s.window, s.bshd, false,
                   std::string("flash_fp16_d96_") + s.label});
  }
  return out;
}

class FusedBackward : public ::testing::TestWithParam<Case> {};

TEST_P(FusedBackward, MatchesFloat64GradientReference) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  const Problem p = problem_of(c);
  auto backend = make(c.backend);
  ASSERT_TRUE(backend->has_backward());
  const Eligibility el = eligibility_of(*backend, p);
  if (c.head_dim > 128 && !cuda::flash_sm90_runs_here()) {
    // Off sm90 no backward of ours takes these head dims: refused by name.
    EXPECT_FALSE(el.eligible);
    EXPECT_NE(el.reason.find("head_dim"), std::string::npos) << el.reason;
    return;
  }
  ASSERT_TRUE(el.eligible) << el.reason;

  const Inputs host = make_inputs(p, 0xbacc + c.seq + c.head_dim, cpu_allocator(), c.bshd);
  const Tensor dout = make_dout(p, 0xbacc + c.seq, cpu_allocator());
  const Gradients g = run_backward(*backend, p, host, dout);
  const GradientErrors e =
      check_gradients_against_reference(p, host, dout, g, sample_rows(p, 4096), sample_kv_rows(p, 4096));
  for (const auto& [name, s] : {std::pair{"dQ", &e.dq}, std::pair{"dK", &e.dk}, std::pair{"dV", &e.dv}}) {
    // 16-bit: rel <= 2 x the floor (no math figure to scale by).
    const Acceptance a = accept(p.dtype, *s, std::nullopt, /*nan_allowed_on_masked_rows=*/false);
    EXPECT_TRUE(a.pass) << p.describe() << " " << name << ": " << a.why << ", max abs " << s->max_abs;
    EXPECT_EQ(s->nan_count, 0) << name;
    EXPECT_GT(s->rows_checked, 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(All, FusedBackward, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

// The acceptance rule can fail: gradients off by 5% (dQ scaled) or the wrong
// tensor (dK and dV swapped) are refused.
TEST(FusedBackwardChecks, ToleranceRejectsWrongGradients) {
  REQUIRE_GPU();
  const Problem p = problem_of({"flash", DType::F16, 64, MaskKind::Causal, 128, 128, 2, 2, 0, false, false, "x"});
  auto flash = make("flash");
  const Inputs host = make_inputs(p, 3, cpu_allocator());
  const Tensor dout = make_dout(p, 3, cpu_allocator());
  Gradients g = run_backward(*flash, p, host, dout);
  const RowSample q_rows = sample_rows(p, 4096), kv_rows = sample_kv_rows(p, 4096);
  GradientErrors e = check_gradients_against_reference(p, host, dout, g, q_rows, kv_rows);
  ASSERT_TRUE(accept(p.dtype, e.dq, std::nullopt, false).pass);

  for (std::int64_t i = 0; i < g.dq.numel(); ++i) {
    const std::int64_t d = i % p.head_dim, r = i / p.head_dim;
    const std::int64_t s = r % p.seq, h = (r / p.seq) % p.heads, b = r / (p.seq * p.heads);
    g.dq.set(b, h, s, d, g.dq.get(b, h, s, d) * 1.05f);
  }
  std::swap(g.dk, g.dv);
  e = check_gradients_against_reference(p, host, dout, g, q_rows, kv_rows);
  EXPECT_FALSE(accept(p.dtype, e.dq, std::nullopt, false).pass) << e.dq.rel;
  EXPECT_FALSE(accept(p.dtype, e.dk, std::nullopt, false).pass) << e.dk.rel;
  EXPECT_FALSE(accept(p.dtype, e.dv, std::nullopt, false).pass) << e.dv.rel;
}

// Bottom-right causal with kv_seq < seq: the first seq - kv_seq query rows see
// no key (dQ exactly 0); a sliding window over a longer kv_seq leaves keys no
// query sees (dK, dV exactly 0). No NaN anywhere.
TEST(FusedBackwardChecks, FullyMaskedRowsAndUnseenKeysGetZeroGradients) {
  REQUIRE_GPU();
  for (const bool deterministic : {false, true}) {
    const Problem p = problem_of(
        {"flash", DType::BF16, 64, MaskKind::CausalBottomRight, 200, 72, 2, 1, 0, false, deterministic, "masked_rows"});
    ASSERT_EQ(p.fully_masked_rows(), 128);
    auto flash = make("flash");
    const Inputs host = make_inputs(p, 5, cpu_allocator());
    const Tensor dout = make_dout(p, 5, cpu_allocator());
    const Gradients g = run_backward(*flash, p, host, dout);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t i = 0; i < p.seq; ++i) {
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            const float x = g.dq.get(b, h, i, d);
            ASSERT_FALSE(std::isnan(x)) << b << "," << h << "," << i << "," << d;
            if (i < 128) {
              ASSERT_EQ(x, 0.0f) << "fully masked row " << i;
            }
          }
        }
      }
    }
    const GradientErrors e =
        check_gradients_against_reference(p, host, dout, g, sample_rows(p, 1 << 20), sample_kv_rows(p, 1 << 20));
    for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
      EXPECT_EQ(s->nan_count, 0);
      EXPECT_TRUE(accept(p.dtype, *s, std::nullopt, false).pass) << accept(p.dtype, *s, std::nullopt, false).why;
    }
  }

  // seq 64, kv_seq 200, window 16: row i sees keys (i + 136 - 16, i + 136]; keys <= 120 none.
  const Problem w =
      problem_of({"flash", DType::F16, 64, MaskKind::SlidingWindow, 64, 200, 2, 2, 16, false, false, "unseen_keys"});
  auto flash = make("flash");
  const Inputs host = make_inputs(w, 6, cpu_allocator());
  const Tensor dout = make_dout(w, 6, cpu_allocator());
  const Gradients g = run_backward(*flash, w, host, dout);
  for (std::int64_t b = 0; b < w.batch; ++b) {
    for (std::int64_t h = 0; h < w.kv_heads; ++h) {
      for (std::int64_t j = 0; j < w.kv_seq; ++j) {
        for (std::int64_t d = 0; d < w.head_dim; ++d) {
          ASSERT_FALSE(std::isnan(g.dk.get(b, h, j, d)) || std::isnan(g.dv.get(b, h, j, d))) << j;
          if (j <= 120) {
            ASSERT_EQ(g.dk.get(b, h, j, d), 0.0f) << "unseen key " << j;
            ASSERT_EQ(g.dv.get(b, h, j, d), 0.0f) << "unseen key " << j;
          }
        }
      }
    }
  }
  const GradientErrors e =
      check_gradients_against_reference(w, host, dout, g, sample_rows(w, 1 << 20), sample_kv_rows(w, 1 << 20));
  for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
    EXPECT_TRUE(accept(w.dtype, *s, std::nullopt, false).pass) << accept(w.dtype, *s, std::nullopt, false).why;
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Deterministic mode: two runs on the same inputs give identical bits (dQ
// without atomics; dK and dV never use them). Each of the sm90 kernel's
// orders (bwd_order_sm90.cuh), on more CTAs than the GPU holds at once (a
// head's key tiles split across waves) where it matters: masked in key-tile
// order (causal, bottom-right, grouped-query window); masked adding from the
// highest key tile down (head dim 256); unmasked with rotated walks; masked
// and unmasked with more key tiles than multiprocessors (key-tile order).
TEST(FusedBackwardChecks, DeterministicIsBitwiseRepeatable) {
  REQUIRE_GPU();
  for (const Case& c : std::vector<Case>{
           {"flash", DType::BF16, 64, MaskKind::Causal, 320, 320, 4, 2, 0, false, true, "causal"},
           {"flash", DType::BF16, 64, MaskKind::None, 320, 320, 4, 2, 0, false, true, "none"},
           {"flash", DType::BF16, 64, MaskKind::None, 1100, 1000, 48, 24, 0, true, true, "none_waves"},
           {"flash", DType::BF16, 192, MaskKind::None, 700, 900, 40, 40, 0, false, true, "none_waves_d192"},
           {"flash", DType::BF16, 64, MaskKind::None, 64, 17500, 1, 1, 0, false, true, "none_past_the_sms"},
           {"flash", DType::BF16, 128, MaskKind::CausalBottomRight, 900, 1300, 6, 3, 0, false, true, "bottom_right"},
           {"flash", DType::BF16, 256, MaskKind::Causal, 1000, 1000, 40, 20, 0, false, true, "causal_waves_d256"},
           {"flash", DType::BF16, 96, MaskKind::SlidingWindow, 2000, 2000, 16, 4, 300, true, true, "window_waves_d96"},
           {"flash", DType::BF16, 256, MaskKind::CausalBottomRight, 64, 8500, 1, 1, 0, false, true,
            "causal_past_the_sms_d256"},
       }) {
    const MaskKind mask = c.mask;
    SCOPED_TRACE(c.label);
    const Problem p = problem_of(c);
    auto flash = make("flash");
    const Inputs host = make_inputs(p, 9, cpu_allocator());
    const Tensor dout = make_dout(p, 9, cpu_allocator());
    const Gradients g1 = run_backward(*flash, p, host, dout);
    const Gradients g2 = run_backward(*flash, p, host, dout);
    EXPECT_TRUE(same_bits(g1.dq, g2.dq)) << mask_name(mask);
    EXPECT_TRUE(same_bits(g1.dk, g2.dk)) << mask_name(mask);
    EXPECT_TRUE(same_bits(g1.dv, g2.dv)) << mask_name(mask);
  }
}

TEST(FusedBackwardChecks, EligibilityNamesWhatTheBackwardCannotDo) {
  REQUIRE_GPU();
  for (const std::string name : {"flash", "efficient"}) {
    auto b = make(name);
    Problem p =
        testing::to_problem({.heads = 2, .seq = 128, .head_dim = 256}, DType::BF16, MaskKind::Causal, Device::Cuda);
    ASSERT_TRUE(eligibility_of(*b, p).eligible) << name << ": the forward at head_dim 256 runs";
    EXPECT_EQ(b->workspace_bytes(p), 0u);
    p.pass = Pass::Backward;
    const Eligibility e = eligibility_of(*b, p);
    if (name == "flash" && cuda::flash_sm90_runs_here()) {
      // flash's sm90 backward takes head dim 256 (its wide tiles).
      EXPECT_TRUE(e.eligible) << e.reason;
      EXPECT_NE(e.reason.find("64-key tile"), std::string::npos) << e.reason;
    } else {
      EXPECT_FALSE(e.eligible) << name;
      EXPECT_NE(e.reason.find("head_dim"), std::string::npos) << e.reason;
    }
    p.head_dim = 128;
    EXPECT_TRUE(eligibility_of(*b, p).eligible) << name;
    EXPECT_EQ(b->expectation(p).device_activities, 3);
    // The saved LSE, D and the dQ accumulator; flash's sm90 backward adds the LSE in log2 units.
    const auto rows = static_cast<std::size_t>(p.batch * p.heads * p.seq);
    const bool sm90 = name == "flash" && eligibility_of(*b, p).reason.find("FlashAttention-3") != std::string::npos;
    EXPECT_EQ(b->workspace_bytes(p), rows * ((sm90 ? 3 : 2) + 128) * 4) << eligibility_of(*b, p).reason;
    p.pass = Pass::Train;
    EXPECT_EQ(b->expectation(p).device_activities, 4);
  }
}

// flash's sm90 backward splits a grouped-query group among CTAs where one
// CTA a (key tile, kv head, batch) would not fill the GPU 1.9 times over, or
// where a wave of whole groups would stream more query heads than 2.5 x the
// L2 holds (bwd_sm90_group_split, tests/cpu/bwd_group_split_test.cpp): the
// fewest parts (a divisor of the group) that meet both, one more where the
// CTAs are few and heavy under a mask; whole groups where
// the batch is packed. The launch reads this GPU's multiprocessors and L2. A
// split costs one more kernel (the partial dK and dV summed) and its FP32
// partials in the workspace, and the runner counts what the expectation
// declares.
TEST(FusedBackwardChecks, GroupSplitFillsTheGpuAndDeclaresItsKernel) {
  REQUIRE_GPU();
  if (!cuda::flash_sm90_runs_here()) GTEST_SKIP() << "flash's sm90 backward only (not an sm90 GPU)";
  int device = 0, sms = 0, l2 = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), cudaSuccess);
  const auto shape = [](std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t s, std::int64_t d) {
    return cuda::FusedBwdShape{
        .batch = b, .heads = h, .kv_heads = hkv, .seq_q = s, .seq_k = s, .head_dim = d, .sm90 = true};
  };
  const auto split_of = [&](std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t s, std::int64_t d) {
    const int split = cuda::flash_sm90_bwd_group_split(shape(b, h, hkv, s, d), false);
    EXPECT_EQ(split, cuda::bwd_sm90_group_split(shape(b, h, hkv, s, d), false, sms, l2)) << "this GPU's facts";
    return split;
  };
  // Multi-query, 2 x 16 / 1 x 4096 x 96 causal: 32 key tiles of 128 x 2 = 64
  // CTAs whole. The fewest parts that fill the GPU 1.9 times, then one
  // divisor more where those CTAs are under 3 waves and each walks 8192
  // query rows or more (a causal grid's heavy first tiles).
  const int mqa = split_of(2, 16, 1, 4096, 96);
  int fewest = 1;
  while (64 * fewest * 10 < 19 * sms && fewest < 16) fewest *= 2;
  const bool heavy = 64 * fewest < 3 * sms && 4096 * (16 / fewest) >= 8192;
  EXPECT_EQ(mqa, heavy ? 2 * fewest : fewest);
  EXPECT_GE(64 * mqa * 10, 19 * sms);
  // 8 key tiles x 64 pairs fill it already; on a 50 MB L2 the wave's heads do not fit.
  EXPECT_EQ(split_of(8, 32, 8, 1024, 128), l2 >= (std::int64_t{256} << 20) * 2 / 5 ? 1 : 2);
  EXPECT_EQ(split_of(2, 16, 16, 128, 64), 1) << "no group to split";
  EXPECT_EQ(cuda::flash_sm90_bwd_group_split(shape(2, 16, 1, 4096, 96), /*packed=*/true), 1);

  Problem p = testing::to_problem({.batch = 2, .heads = 4, .seq = 256}, DType::BF16, MaskKind::Causal, Device::Cuda);
  p.kv_heads = 1;
  p.pass = Pass::Backward;
  p.validate();
  auto flash = make("flash");
  ASSERT_GT(split_of(2, 4, 1, 256, 64), 1);
  EXPECT_EQ(flash->expectation(p).device_activities, 4);
  RunOptions o;
  o.schedule = Schedule{.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  const RunResult r = run_backend(*flash, p, o);
  ASSERT_FALSE(r.failure) << *r.failure;
  ASSERT_TRUE(r.acceptance);
  EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why;
  if (r.metrics.kernels_per_forward) EXPECT_EQ(*r.metrics.kernels_per_forward, 4);
}

// Through the runner: --pass backward and train on flash, its own accuracy
// check, and the declared kernels per call against CUPTI where it is loaded.
TEST(FusedBackwardChecks, RunnerTimesAndChecksTheBackward) {
  REQUIRE_GPU();
  for (const Pass pass : {Pass::Backward, Pass::Train}) {
    for (const bool deterministic : {false, true}) {
      Problem p =
          testing::to_problem({.batch = 2, .heads = 4, .seq = 256}, DType::BF16, MaskKind::Causal, Device::Cuda);
      p.pass = pass;
      p.deterministic = deterministic;
      p.validate();
      auto flash = make("flash");
      RunOptions o;
      o.schedule = Schedule{.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
      const RunResult r = run_backend(*flash, p, o);
      ASSERT_FALSE(r.failure) << *r.failure;
      ASSERT_TRUE(r.acceptance);
      EXPECT_TRUE(r.acceptance->pass) << pass_name(pass) << ": " << r.acceptance->why;
      if (r.metrics.kernels_per_forward) {
        EXPECT_EQ(*r.metrics.kernels_per_forward, r.expectation.device_activities) << pass_name(pass);
      }
      // On sm90 the backward is the sm90a kernel (not the sm80 fallback that a
      // register split ptxas did not give would take), and explain says so.
      if (r.trace.device && r.trace.device->compute_major == 9) {
        EXPECT_NE(r.eligibility.reason.find("FlashAttention-3 class on sm90: TMA loads of Q, dO"), std::string::npos)
            << r.eligibility.reason;
        bool sm90_kernel = false, sm80_kernel = false;
        for (const Activity& act : r.trace.activities) {
          if (act.type != ActivityType::Kernel) continue;
          sm90_kernel |= act.name.find("flash_bwd_sm90_kernel") != std::string::npos;
          sm80_kernel |= act.name.find("flash_bwd_dkdv_kernel") != std::string::npos;
        }
        if (!r.trace.collector_note.empty() && r.trace.collector_note.find("CUPTI unavailable") != std::string::npos) {
          continue;  // no kernel names without CUPTI
        }
        EXPECT_TRUE(sm90_kernel) << pass_name(pass) << (deterministic ? " deterministic" : "");
        EXPECT_FALSE(sm80_kernel) << pass_name(pass);
      }
    }
  }
}

}  // namespace
}  // namespace attnprof
