// Flash's split-KV decode kernel (kernels/flash_decode.cuh) through the flash
// backend: few queries against a long KV cache, contiguous and paged, against
// the float64 reference; with one split and with several (and so the combine
// kernel), each counted against CUPTI; every mask, grouped-query packing,
// fully masked rows, the LSE a training step saves; and the one-line
// refusals of what no kernel takes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/runner.h"
#include "backends/cuda/fused_backend.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "common/test_problem.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

Backend& flash() {
  Backend* b = find_backend("flash", Device::Cuda);
  if (b == nullptr) throw std::runtime_error("no CUDA flash backend in this build");
  return *b;
}

struct Case {
  const char* label;
  testing::Shape shape;
  std::int64_t page;  // 0: contiguous
  MaskKind mask;
  DType dtype = DType::BF16;
  Pass pass = Pass::Forward;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

Problem problem_of(const Case& c) {
  Problem p = testing::to_problem(c.shape, c.dtype, c.mask, Device::Cuda);
  if (c.page > 0) {
    p.kv_cache = KvCache::Paged;
    p.page_size = c.page;
  }
  p.pass = c.pass;
  p.validate();
  return p;
}

// The kernel's plan for a problem, as the backend makes it.
cuda::DecodePlan plan_of(const Problem& p) { return cuda::flash_decode_plan(cuda::fused_params_for(p)); }

class FlashDecode : public ::testing::TestWithParam<Case> {};

TEST_P(FlashDecode, MatchesFloat64AndItsKernelCount) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  const Problem p = problem_of(c);
  const Eligibility el = eligibility_of(flash(), p);
  ASSERT_TRUE(el.eligible) << el.reason;
  EXPECT_NE(el.reason.find("split-KV decode"), std::string::npos) << el.reason;
  RunOptions o;
  o.schedule = Schedule{.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  o.check_rows = 1024;
  o.unprofiled_calls = 0;
  const RunResult r = run_backend(flash(), p, o);
  ASSERT_FALSE(r.failure) << *r.failure;
  ASSERT_TRUE(r.acceptance) << "no float64 check";
  EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why << " (" << p.describe() << ")";
  // A combine kernel after the split kernel, unless the last split merges (ATTNPROF_DECODE_FUSED_COMBINE=1).
  const cuda::DecodePlan decode = plan_of(p);
  const int forward_kernels = decode.splits > 1 && !decode.fused_combine ? 2 : 1;
  // The backward: D = rowsum(dO O), the dK/dV kernel, the dQ conversion, and,
  // where the sm90 backward splits a key tile's query heads among CTAs (one
  // sequence, 2 kv heads: too few tiles to fill the GPU), the kernel that
  // sums their FP32 dK and dV in order (issue 57 item 5: train_seq4 saw 6).
  const auto* fused = dynamic_cast<const cuda::FusedBackend*>(&flash());
  ASSERT_NE(fused, nullptr);
  const int backward_kernels = 3 + (fused->backward_shape(p).group_split > 1 ? 1 : 0);
  EXPECT_EQ(r.expectation.device_activities,
            c.pass == Pass::Train ? forward_kernels + backward_kernels : forward_kernels);
  if (r.metrics.kernels_per_forward) {
    EXPECT_EQ(*r.metrics.kernels_per_forward - r.metrics.memsets_per_forward, r.expectation.device_activities);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, FlashDecode,
    ::testing::Values(
        // One sequence: the keys split to fill the GPU, then the combine kernel.
        Case{"seq1_gqa4_split",
             {.batch = 1, .heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 4100, .head_dim = 128},
             0,
             MaskKind::CausalBottomRight},
        Case{"seq1_paged16_split",
             {.batch = 1, .heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 4100, .head_dim = 128},
             16,
             MaskKind::CausalBottomRight},
        Case{"seq4_paged64_fp16_mqa",
             {.batch = 3, .heads = 8, .kv_heads = 1, .seq = 4, .kv_seq = 1000, .head_dim = 64},
             64,
             MaskKind::CausalBottomRight,
             DType::F16},
        Case{"seq16_gqa_none",
             {.batch = 2, .heads = 8, .kv_heads = 2, .seq = 16, .kv_seq = 333, .head_dim = 128},
             0,
             MaskKind::None},
        Case{"seq16_topleft_causal",
             {.batch = 2, .heads = 4, .seq = 16, .kv_seq = 300, .head_dim = 64},
             0,
             MaskKind::Causal},
        Case{"seq8_window",
             {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 8, .kv_seq = 700, .head_dim = 128, .window = 100},
             32,
             MaskKind::SlidingWindow},
        Case{"seq3_d256_paged",
             {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 3, .kv_seq = 515, .head_dim = 256},
             16,
             MaskKind::CausalBottomRight},
        // A window longer than the cache: its lower bound falls before key 0.
        Case{"window_past_key0",
             {.batch = 2, .heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 300, .head_dim = 128, .window = 4096},
             0,
             MaskKind::SlidingWindow},
        Case{"window_past_key0_paged",
             {.batch = 2, .heads = 8, .kv_heads = 2, .seq = 16, .kv_seq = 200, .head_dim = 64, .window = 1000},
             16,
             MaskKind::SlidingWindow},
        // More keys than queries reversed: rows 0..7 see no key and are zeros.
        Case{"fully_masked_rows",
             {.batch = 1, .heads = 2, .seq = 16, .kv_seq = 8, .head_dim = 64},
             0,
             MaskKind::CausalBottomRight},
        // A paged cache with a prefill-length query: two 64-row decode tiles.
        Case{"paged_seq40_rowblocks",
             {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 40, .kv_seq = 300, .head_dim = 128},
             16,
             MaskKind::CausalBottomRight},
        // The wide tile (64 rows a CTA, a warp each 16, every key): many
        // queries x a group; split and combined, paged, d256, rows padded.
        Case{"wide_seq16_gqa4_paged16_split",
             {.batch = 1, .heads = 8, .kv_heads = 2, .seq = 16, .kv_seq = 3000, .head_dim = 128},
             16,
             MaskKind::CausalBottomRight},
        Case{"wide_seq16_d256_window",
             {.batch = 2, .heads = 8, .kv_heads = 2, .seq = 16, .kv_seq = 777, .head_dim = 256, .window = 300},
             0,
             MaskKind::SlidingWindow},
        Case{"wide_seq13_fp16_padded_rows",
             {.batch = 3, .heads = 12, .kv_heads = 3, .seq = 13, .kv_seq = 1000, .head_dim = 64},
             64,
             MaskKind::CausalBottomRight,
             DType::F16},
        // The wide tile on one split (O and the LSE written directly, no
        // combine), in training; and its rows that see no key.
        Case{"wide_one_split_train",
             {.batch = 64, .heads = 32, .kv_heads = 8, .seq = 16, .kv_seq = 512, .head_dim = 64},
             0,
             MaskKind::CausalBottomRight,
             DType::BF16,
             Pass::Train},
        Case{"wide_fully_masked_rows_paged",
             {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 40, .kv_seq = 20, .head_dim = 128},
             16,
             MaskKind::CausalBottomRight},
        // The batch fills the GPU: one split, no combine.
        Case{"batch64_one_split",
             {.batch = 64, .heads = 32, .kv_heads = 8, .seq = 1, .kv_seq = 512, .head_dim = 128},
             64,
             MaskKind::CausalBottomRight},
        // The LSE the decode kernel saves feeds the fused backward.
        Case{"train_seq4",
             {.batch = 1, .heads = 8, .kv_heads = 2, .seq = 4, .kv_seq = 2000, .head_dim = 64},
             0,
             MaskKind::CausalBottomRight,
             DType::BF16,
             Pass::Train}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(FlashDecode, SplitsOnlyWhenTheBatchLeavesTheGpuIdle) {
  REQUIRE_GPU();
  const Problem one = problem_of({"",
                                  {.batch = 1, .heads = 32, .kv_heads = 8, .seq = 1, .kv_seq = 8192, .head_dim = 128},
                                  0,
                                  MaskKind::CausalBottomRight});
  const Problem full = problem_of({"",
                                   {.batch = 64, .heads = 32, .kv_heads = 8, .seq = 1, .kv_seq = 4096, .head_dim = 128},
                                   0,
                                   MaskKind::CausalBottomRight});
  EXPECT_GT(plan_of(one).splits, 4);
  EXPECT_GT(plan_of(one).workspace_bytes, 0u);
  EXPECT_EQ(plan_of(full).splits, 1);
  EXPECT_EQ(plan_of(full).workspace_bytes, 0u);
}

// 64 rows a CTA once a KV head has more packed rows (queries x group) than
// one 16-row tile holds.
TEST(FlashDecode, TakesTheWideTileForAKvHeadsManyRows) {
  REQUIRE_GPU();
  if (std::getenv("ATTNPROF_DECODE_ROWS") != nullptr) GTEST_SKIP() << "ATTNPROF_DECODE_ROWS forces the tile";
  auto rows_of = [](std::int64_t seq, std::int64_t heads, std::int64_t kv_heads) {
    const Problem p =
        problem_of({"",
                    {.batch = 4, .heads = heads, .kv_heads = kv_heads, .seq = seq, .kv_seq = 2048, .head_dim = 128},
                    16,
                    MaskKind::CausalBottomRight});
    const cuda::DecodePlan plan = plan_of(p);
    return std::pair{plan.rows, plan.row_blocks};
  };
  EXPECT_EQ(rows_of(1, 32, 8), std::pair(16, 1));
  EXPECT_EQ(rows_of(4, 32, 8), std::pair(16, 1));
  EXPECT_EQ(rows_of(5, 32, 8), std::pair(64, 1));
  EXPECT_EQ(rows_of(8, 32, 8), std::pair(64, 1));
  EXPECT_EQ(rows_of(16, 32, 8), std::pair(64, 1));
  EXPECT_EQ(rows_of(16, 64, 8), std::pair(64, 2));
  EXPECT_EQ(rows_of(40, 4, 4), std::pair(64, 1));
  EXPECT_EQ(rows_of(16, 4, 4), std::pair(16, 1));
}

TEST(FlashDecode, RefusesWhatNoKernelTakesInOneLine) {
  REQUIRE_GPU();
  // A paged cache at a head dim the decode kernel is not built for.
  const Problem d96 = problem_of(
      {"", {.batch = 1, .heads = 2, .seq = 1, .kv_seq = 100, .head_dim = 96}, 16, MaskKind::CausalBottomRight});
  const Eligibility el = eligibility_of(flash(), d96);
  EXPECT_FALSE(el.eligible);
  EXPECT_NE(el.reason.find("built for head_dim 64, 128, 256"), std::string::npos) << el.reason;
  EXPECT_EQ(el.reason.find('\n'), std::string::npos);
  // Efficient reads no pages.
  const Problem d64 = problem_of(
      {"", {.batch = 1, .heads = 2, .seq = 1, .kv_seq = 100, .head_dim = 64}, 16, MaskKind::CausalBottomRight});
  Backend* efficient = find_backend("efficient", Device::Cuda);
  ASSERT_NE(efficient, nullptr);
  EXPECT_FALSE(eligibility_of(*efficient, d64).eligible);
  // A query longer than the decode kernel takes, on a contiguous cache: the
  // prefill kernel runs, and explain says why.
  const Problem long_q = problem_of(
      {"", {.batch = 1, .heads = 2, .seq = 40, .kv_seq = 300, .head_dim = 64}, 0, MaskKind::CausalBottomRight});
  const Eligibility prefill = eligibility_of(flash(), long_q);
  ASSERT_TRUE(prefill.eligible) << prefill.reason;
  EXPECT_NE(prefill.reason.find("takes at most 16 queries, this has 40"), std::string::npos) << prefill.reason;
}

}  // namespace
}  // namespace attnprof
