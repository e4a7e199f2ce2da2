// Two choices of flash's sm90a forward that the defaults do not take but
// that stay built (docs/perf/fused-kernels.md, runs 11-12), against float64
// (fused_forward_check.h), with and without the log-sum-exp: the key loop
// without the intra-warpgroup overlap (S, softmax, P V in turn), and the
// persistent scheduler, here with a 256 KB L2 budget so that small problems
// are cut into several head sections, the last one short, and on a few CTAs
// (FewCtas below). This file instantiates the kernel templates itself.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cuda/kernels/flash_fwd_sm90.cuh"
#include "backends/cuda/launch/fused_kernels.h"
#include "fused_forward_check.h"

namespace {

using namespace attnprof::testing::fused;

namespace kern = attnprof::cuda::kernels;

// The persistent scheduler on at most 5 CTAs, so that every CTA takes several
// tiles (on 132 SMs the test problems would give each CTA one): Q handed back
// between tiles, the K/V pipeline state and the pingpong turns carried over,
// an empty tile followed by a full one.
template <kern::MaskMode kMask, int kBlockM, int kD>
struct FewCtas : kern::PersistentTileScheduler<kMask, kBlockM, kD, std::int64_t{256} << 10> {
  static dim3 grid(const kern::FwdArgs& a, int /*sms*/) {
    return dim3(std::min(kern::PersistentTileScheduler<kMask, kBlockM, kD, std::int64_t{256} << 10>::tiles(a), 5));
  }
};

enum class Choice { InTurn, Persistent };

template <int kD, kern::MaskMode kMask, bool kLse>
cudaError_t launch_sm90_choice(Choice k, const kern::FwdArgs& a) {
  using Default = kern::FlashSm90DefaultCfg<kD>;
  if (k == Choice::InTurn) {
    using InTurn = kern::FlashSm90Cfg<kD, Default::kBlockN, 2, 2, false, true, false, false>;
    return kern::run_flash_fwd_sm90<InTurn, kMask, kern::Bf16, kLse>(a, nullptr);
  }
  return kern::run_flash_fwd_sm90<Default, kMask, kern::Bf16, kLse, FewCtas<kMask, Default::kBlockM, kD>>(a, nullptr);
}

template <int kD>
cudaError_t launch_sm90_choice(Choice k, const FusedParams& p) {
  const kern::FwdArgs a = kern::FwdArgs::from(p);
  const auto with_lse = [&]<kern::MaskMode kMask>() {
    return a.lse != nullptr ? launch_sm90_choice<kD, kMask, true>(k, a) : launch_sm90_choice<kD, kMask, false>(k, a);
  };
  return kern::with_mask_mode(p.mask, cudaErrorInvalidValue, with_lse);
}

// Built for bf16 at head dims 64 and 128 (the cases below).
template <Choice kChoice>
cudaError_t launch_choice(const FusedParams& p) {
  if (!p.bf16) return cudaErrorNotSupported;
  if (p.head_dim == 64) return launch_sm90_choice<64>(kChoice, p);
  if (p.head_dim == 128) return launch_sm90_choice<128>(kChoice, p);
  return cudaErrorNotSupported;
}

const Launcher kChoices[] = {{"flash_sm90_in_turn", &launch_choice<Choice::InTurn>, true},
                             {"flash_sm90_persistent", &launch_choice<Choice::Persistent>, true}};

class FusedSm90Choices : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FusedSm90Choices, MatchesFloat64Reference) {
  SKIP_WITHOUT_SM80();
  if (!attnprof::cuda::flash_sm90_runs_here()) GTEST_SKIP() << "flash's sm90a kernel runs on sm90 GPUs only";
  expect_matches_float64(GetParam());
}

TEST_P(FusedSm90Choices, LogSumExpMatchesFloat64) {
  SKIP_WITHOUT_SM80();
  if (!attnprof::cuda::flash_sm90_runs_here()) GTEST_SKIP() << "flash's sm90a kernel runs on sm90 GPUs only";
  expect_lse_matches_float64(GetParam());
}

constexpr MaskKind kNone = MaskKind::None, kCausal = MaskKind::Causal, kBR = MaskKind::CausalBottomRight,
                   kWin = MaskKind::SlidingWindow;

// Ragged tiles, every mask, grouped heads, fully masked rows; at 16 (batch,
// head) pairs and these lengths, the 256 KB budget makes sections of 2-10
// pairs.
std::vector<KernelCase> sm90_choice_cases() {
  const std::vector<Case> cases = {
      {"d64_causal_q333_k200", 2, 8, 8, 333, 200, 64, kCausal},
      {"d64_window17_q333_k200", 2, 8, 4, 333, 200, 64, kWin, 17},
      {"d128_none_q200_k333", 2, 8, 2, 200, 333, 128, kNone},
      {"d128_bottomright_q333_k200", 2, 8, 8, 333, 200, 128, kBR},  // 133 fully masked rows a head
      {"bshd_d128_causal_q200_k333", 1, 16, 4, 200, 333, 128, kCausal, 0, true, true},
  };
  std::vector<KernelCase> out;
  for (const Launcher& k : kChoices)
    for (const Case& c : cases) out.push_back({c, k});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, FusedSm90Choices, ::testing::ValuesIn(sm90_choice_cases()), case_name);

}  // namespace
