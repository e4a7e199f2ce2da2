// Our fused attention forwards through their public launchers (flash on the
// path the device takes, flash's sm80 path on its own, efficient) against
// float64 (fused_forward_check.h), with and without the log-sum-exp; and the
// launchers' refusals and path choices.
#include "backends/cuda/launch/fused_kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fused_forward_check.h"

namespace {

using namespace attnprof::testing::fused;

// 192 runs on flash's sm90a kernel only.
#define SKIP_WHERE_HEAD_DIM_IS_NOT_BUILT(kc)                                                \
  if ((kc).c.head_dim == 192 && !attnprof::cuda::flash_sm90_runs_here()) {                  \
    GTEST_SKIP() << "head_dim 192 runs on flash's sm90a kernel only; this GPU is not sm90"; \
  }

cudaError_t launch_flash(const FusedParams& p) { return attnprof::cuda::launch_flash(p, nullptr); }
cudaError_t launch_flash_sm80(const FusedParams& p) { return attnprof::cuda::launch_flash_sm80(p, nullptr); }
cudaError_t launch_efficient(const FusedParams& p) { return attnprof::cuda::launch_efficient(p, nullptr); }

// flash first: the only one that takes head dim 192 and soft caps.
const Launcher kLaunchers[] = {
    {"flash", &launch_flash, true}, {"flash_sm80", &launch_flash_sm80, true}, {"efficient", &launch_efficient, false}};

class FusedKernels : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FusedKernels, MatchesFloat64Reference) {
  SKIP_WITHOUT_SM80();
  const KernelCase& kc = GetParam();
  SKIP_WHERE_HEAD_DIM_IS_NOT_BUILT(kc);
  expect_matches_float64(kc);
}

TEST_P(FusedKernels, LogSumExpMatchesFloat64) {
  SKIP_WITHOUT_SM80();
  const KernelCase& kc = GetParam();
  SKIP_WHERE_HEAD_DIM_IS_NOT_BUILT(kc);
  expect_lse_matches_float64(kc);
}

constexpr MaskKind kNone = MaskKind::None, kCausal = MaskKind::Causal, kBR = MaskKind::CausalBottomRight,
                   kWin = MaskKind::SlidingWindow;

std::vector<KernelCase> all_cases() {
  const std::vector<Case> cases = {
      // name, B, H, Hkv, Sq, Sk, D, mask, window, bf16, bshd, scale
      {"d64_none", 2, 3, 3, 256, 256, 64, kNone},
      {"d64_causal_200", 2, 3, 3, 200, 200, 64, kCausal},
      {"d64_causal_q200_k333", 1, 2, 2, 200, 333, 64, kCausal},
      {"d64_causal_q333_k200", 1, 2, 2, 333, 200, 64, kCausal},
      {"d64_bottomright_q333_k200", 1, 2, 2, 333, 200, 64, kBR},  // 133 fully masked rows
      {"d64_bottomright_q200_k333", 1, 2, 2, 200, 333, 64, kBR},
      {"d64_window64_300", 1, 2, 2, 300, 300, 64, kWin, 64},
      {"d64_window17_q333_k200", 1, 2, 2, 333, 200, 64, kWin, 17},
      {"d64_none_q333_k200_scale", 1, 2, 2, 333, 200, 64, kNone, 0, true, false, 0.3f},
      {"d128_none_q200_k333", 1, 2, 2, 200, 333, 128, kNone},
      {"d128_causal_333", 1, 2, 2, 333, 333, 128, kCausal},
      {"d128_bottomright_q333_k200", 1, 2, 2, 333, 200, 128, kBR},
      {"d128_window100_q200_k333", 1, 2, 2, 200, 333, 128, kWin, 100},
      {"fp16_d64_causal_200", 2, 2, 2, 200, 200, 64, kCausal, 0, false},
      {"fp16_d128_none_q333_k200", 1, 2, 2, 333, 200, 128, kNone, 0, false},
      {"fp16_d64_bottomright_q333_k200", 1, 2, 2, 333, 200, 64, kBR, 0, false},
      {"gqa4_d64_causal", 2, 8, 2, 200, 200, 64, kCausal},
      {"mqa_d128_bottomright_q200_k333", 1, 4, 1, 200, 333, 128, kBR},
      {"bshd_d64_causal", 2, 3, 3, 200, 200, 64, kCausal, 0, true, true},
      {"bshd_gqa_d128_none_q333_k200", 1, 4, 2, 333, 200, 128, kNone, 0, true, true},
      {"bshd_fp16_d64_window_q200_k333", 1, 4, 2, 200, 333, 64, kWin, 50, false, true},
      {"decode_d64_bottomright_q1_k77", 2, 2, 2, 1, 77, 64, kBR},
      {"d32_causal_200", 1, 2, 2, 200, 200, 32, kCausal},
      {"d96_bottomright_q333_k200", 1, 2, 2, 333, 200, 96, kBR},
      {"d256_causal_q200_k333", 1, 2, 2, 200, 333, 256, kCausal},
      {"d256_none_q333_k200", 1, 2, 1, 333, 200, 256, kNone},
      {"fp16_d256_bottomright_q200_k333", 1, 2, 2, 200, 333, 256, kBR, 0, false},
      {"gqa_d96_window64_300", 1, 4, 2, 300, 300, 96, kWin, 64},
      {"bshd_d96_none_q200_k333", 1, 2, 2, 200, 333, 96, kNone, 0, true, true},
      // 192: flash on sm90 only (kFlashSm90HeadDims).
      {"d192_causal_333", 1, 2, 2, 333, 333, 192, kCausal},
      {"gqa_d192_none_q200_k333", 1, 4, 2, 200, 333, 192, kNone},
      {"bshd_fp16_d192_bottomright_q333_k200", 1, 4, 2, 333, 200, 192, kBR, 0, false, true},
      // Few queries: flash takes its split-KV decode kernel (one split here: no workspace).
      {"decode_gqa4_d128_q16_k1000", 2, 8, 2, 16, 1000, 128, kBR},
      {"decode_mqa_d256_q3_k300_none", 1, 4, 1, 3, 300, 256, kNone},
      {"decode_window100_d64_q8_k500", 1, 4, 2, 8, 500, 64, kWin, 100},
      {"decode_fp16_bshd_d128_q4_k777", 2, 4, 4, 4, 777, 128, kBR, 0, false, true},
      // Soft-capped: bf16 on the fixed base (its row sums from the tensor cores), fp16 and a cap past the
      // fixed base's bound on the running max.
      {"softcap30_gqa_d64_causal_q200_k333", 1, 4, 2, 200, 333, 64, kCausal, 0, true, false, 0.f, 30.f},
      {"softcap50_d128_none_q333_k200", 2, 4, 4, 333, 200, 128, kNone, 0, true, false, 0.f, 50.f},
      {"softcap30_d256_bottomright_q333_k200", 1, 2, 2, 333, 200, 256, kBR, 0, true, false, 0.f, 30.f},
      {"softcap60_d128_window40_333", 1, 4, 4, 333, 333, 128, kWin, 40, true, false, 0.f, 60.f},
      {"fp16_softcap30_d96_causal_333", 1, 4, 4, 333, 333, 96, kCausal, 0, false, false, 0.f, 30.f},
      // A cap of 4 at the default scale: scores up to about the cap's size, not far inside it.
      {"softcap4_d64_none_q333_k300", 1, 4, 2, 333, 300, 64, kNone, 0, true, false, 0.f, 4.f},
      {"softcap4_d128_causal_333", 1, 4, 4, 333, 333, 128, kCausal, 0, true, false, 0.f, 4.f},
  };
  std::vector<KernelCase> out;
  for (const Launcher& k : kLaunchers)
    for (const Case& c : cases) {
      if ((c.head_dim == 192 || c.softcap > 0) && k.launch != kLaunchers[0].launch) continue;  // sm90 only
      out.push_back({c, k});
    }
  return out;
}

// Every head dim the kernels are built for has at least one case above.
TEST(FusedKernelsSupport, CasesCoverEveryBuiltHeadDim) {
  const std::vector<KernelCase> cases = all_cases();
  for (const int d : attnprof::cuda::kFusedHeadDims) {
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(), [d](const KernelCase& kc) { return kc.c.head_dim == d; }))
        << "no case at head_dim " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(All, FusedKernels, ::testing::ValuesIn(all_cases()), case_name);

// A shape-only problem (nothing is launched on it): 4 heads over 2 KV heads,
// 8 rows, every stride one head_dim-wide row.
FusedParams shape_only(int head_dim) {
  alignas(16) static std::uint16_t dummy[8];
  const std::int64_t r = head_dim;
  return FusedParams{.q = dummy,
                     .k = dummy,
                     .v = dummy,
                     .o = dummy,
                     .q_batch_stride = r,
                     .q_head_stride = r,
                     .q_row_stride = r,
                     .k_batch_stride = r,
                     .k_head_stride = r,
                     .k_row_stride = r,
                     .v_batch_stride = r,
                     .v_head_stride = r,
                     .v_row_stride = r,
                     .o_batch_stride = r,
                     .o_head_stride = r,
                     .o_row_stride = r,
                     .batch = 1,
                     .heads = 4,
                     .kv_heads = 2,
                     .seq_q = 8,
                     .seq_k = 8,
                     .head_dim = head_dim,
                     .scale = 0.125f,
                     .mask = MaskKind::Causal};
}

TEST(FusedKernelsSupport, ReasonsSayWhatToChange) {
  SKIP_WITHOUT_SM80();
  const FusedParams p = shape_only(64);
  EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, true), nullptr);
  EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, false), nullptr);

  FusedParams bad = p;
  bad.head_dim = 80;
  const char* reason = attnprof::cuda::fused_unsupported_reason(bad, true);
  ASSERT_NE(reason, nullptr);
  EXPECT_NE(std::string(reason).find("head_dim 80"), std::string::npos) << reason;
  EXPECT_EQ(attnprof::cuda::launch_flash_sm80(bad, nullptr), cudaErrorInvalidValue);

  bad = p;
  bad.kv_heads = 3;
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(bad, false), nullptr);
  bad = p;
  bad.q_row_stride = 60;
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(bad, true), nullptr);
  bad = p;
  bad.mask = MaskKind::SlidingWindow;
  bad.window = 0;
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(bad, true), nullptr);
}

// Hopper takes the sm90a kernel at the head dims of kFlashSm90HeadDims (our
// builds always include sm_90a), and the sm80 kernel at the others; other GPUs
// never take it. Every built head dim is accepted by both kernels.
TEST(FusedKernelsSupport, Sm90PathWhereItApplies) {
  SKIP_WITHOUT_SM80();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  for (const int d : attnprof::cuda::kFusedHeadDims) {
    FusedParams p = shape_only(d);
    p.seq_q = p.seq_k = 64;  // past the decode kernel's queries
    EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, true), nullptr) << "head_dim " << d;
    EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, false), nullptr) << "head_dim " << d;
    const bool sm90 = attnprof::cuda::flash_sm90_head_dim(d);
    EXPECT_EQ(attnprof::cuda::flash_sm90_applies(p), major == 9 && sm90) << "head_dim " << d;
    if (!sm90) EXPECT_EQ(attnprof::cuda::launch_flash_sm90(p, nullptr), cudaErrorNotSupported);
  }
  // 192: flash on sm90 only, efficient never.
  FusedParams p192 = shape_only(192);
  p192.seq_q = p192.seq_k = 64;
  EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p192, true) == nullptr, major == 9);
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(p192, false), nullptr);
  // 8 queries at a decode head dim: the decode kernel, not the sm90 prefill one.
  EXPECT_TRUE(attnprof::cuda::flash_decode_takes(shape_only(128)));
  EXPECT_FALSE(attnprof::cuda::flash_sm90_applies(shape_only(128)));
}

}  // namespace
