// flash's sm90 backward's group split (bwd_sm90_group_split, fused_params.h):
// the split each measured grouped-query row ran fastest at (H100, 2026-12-07,
// docs/perf/backward.md), what the rule's two conditions make of a GPU's
// size, and the problems it never splits. The rule runs on the host at
// launch; the kernels' order functions it reads are the ones the kernel takes
// (BwdOrderSm90 calls them).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "backends/cuda/fused_params.h"

namespace attnprof::cuda {
namespace {

constexpr int kH100Sms = 132;
constexpr std::int64_t kH100L2 = std::int64_t{50} << 20;

FusedBwdShape shape(std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t s, std::int64_t d, bool masked) {
  return FusedBwdShape{.batch = b,
                       .heads = h,
                       .kv_heads = hkv,
                       .seq_q = s,
                       .seq_k = s,
                       .head_dim = d,
                       .deterministic = false,
                       .sm90 = true,
                       .masked = masked};
}

struct Measured {
  const char* row;
  FusedBwdShape s;
  int fastest;  // the split that ran fastest among those measured
};

// Rows whose splits were all timed in one run on the H100 (c2/c3, 2026-12-07):
// 8x32/8x1024x128 causal 1: 766, 2: 679, 4: 721 us; 4x28/4x2048x128 causal 1:
// 1028, 7: 840; 8x8/1x1024x64 causal 2: 127, 4: 94, 8: 113; 8x32/8x1024x128
// unmasked at 1 (777 us) is ahead of cudnn (853). Session 26 (15:00 UTC):
// 2x16/1x4096x96 causal 1: 2257, 2: 1191, 4: 752, 8: 687, 16: 737 us.
TEST(BwdGroupSplit, EachMeasuredRowGetsTheSplitThatRanFastest) {
  const Measured rows[] = {
      {"8x32/8x1024x128 causal", shape(8, 32, 8, 1024, 128, true), 2},
      {"4x28/4x2048x128 causal", shape(4, 28, 4, 2048, 128, true), 7},
      {"8x8/1x1024x64 causal", shape(8, 8, 1, 1024, 64, true), 4},
      {"8x32/8x1024x128 none", shape(8, 32, 8, 1024, 128, false), 1},
      {"2x16/1x4096x96 causal", shape(2, 16, 1, 4096, 96, true), 8},
  };
  for (const Measured& m : rows) {
    EXPECT_EQ(bwd_sm90_group_split(m.s, false, kH100Sms, kH100L2), m.fastest) << m.row;
  }
}

TEST(BwdGroupSplit, TheSplitDividesTheGroupAndGrowsAsTheL2Shrinks) {
  for (const std::int64_t group : {2, 3, 4, 6, 7, 8, 16}) {
    for (const std::int64_t seq : {128, 1024, 4096, 16384}) {
      for (const std::int64_t d : {64, 96, 128, 256}) {
        for (const bool masked : {false, true}) {
          const FusedBwdShape s = shape(2, 2 * group, 2, seq, d, masked);
          const int split = bwd_sm90_group_split(s, false, kH100Sms, kH100L2);
          const std::string at = std::to_string(group) + " " + std::to_string(seq) + " " + std::to_string(d);
          ASSERT_GE(split, 1) << at;
          EXPECT_EQ(group % split, 0) << at;
          // A smaller L2 never takes fewer parts (the first split that fits
          // a larger one comes no later than the least wave).
          EXPECT_GE(bwd_sm90_group_split(s, false, kH100Sms, kH100L2 / 4), split) << at;
          EXPECT_GE(bwd_sm90_group_split(s, false, kH100Sms, 0), 1) << at;
        }
      }
    }
  }
}

TEST(BwdGroupSplit, TheL2DecidesWhereTheCtasAlreadyFillTheGpu) {
  // 8x32/8x1024x128 causal: 512 CTAs with the group whole (two waves and
  // more), but a wave then streams 256 MB of query heads.
  const FusedBwdShape s = shape(8, 32, 8, 1024, 128, true);
  EXPECT_EQ(bwd_sm90_group_split(s, false, kH100Sms, std::int64_t{1} << 30), 1) << "an L2 that holds the wave";
  EXPECT_EQ(bwd_sm90_group_split(s, false, kH100Sms, kH100L2), 2);
  EXPECT_EQ(bwd_sm90_group_split(s, false, kH100Sms, kH100L2 / 4), 4) << "each CTA one query head";
  // Few CTAs: split until 1.9 waves, whatever the L2 (8x8/1x1024x64: 64 CTAs whole, 256 at 4).
  EXPECT_EQ(bwd_sm90_group_split(shape(8, 8, 1, 1024, 64, true), false, kH100Sms, std::int64_t{1} << 40), 4);
}

// A deterministic grid runs as one chunk in key-tile order: every split's
// wave spans every query head, so splitting buys no L2 and costs its sums.
TEST(BwdGroupSplit, DeterministicSplitsOnlyToFillTheGpu) {
  FusedBwdShape s = shape(8, 32, 8, 1024, 128, true);
  s.deterministic = true;
  EXPECT_EQ(bwd_sm90_group_split(s, false, kH100Sms, kH100L2), 1) << "512 CTAs fill it; no split fits the L2 better";
  FusedBwdShape mqa = shape(8, 8, 1, 1024, 64, true);
  mqa.deterministic = true;
  EXPECT_EQ(bwd_sm90_group_split(mqa, false, kH100Sms, kH100L2), 4) << "the split that fills 1.9 waves";
  // Too long for any split's wave to fit: the least wave, not the most parts.
  const FusedBwdShape longest = shape(1, 16, 4, 1 << 18, 128, true);
  const int split = bwd_sm90_group_split(longest, false, kH100Sms, kH100L2);
  EXPECT_EQ(4 % split, 0);
  EXPECT_GE(split, 1);
}

TEST(BwdGroupSplit, NeverSplitsWhatTheKernelCannot) {
  FusedBwdShape s = shape(8, 32, 8, 1024, 128, true);
  EXPECT_EQ(bwd_sm90_group_split(s, /*packed=*/true, kH100Sms, kH100L2), 1) << "packed batches";
  s.sm90 = false;
  EXPECT_EQ(bwd_sm90_group_split(s, false, kH100Sms, kH100L2), 1) << "the sm80 kernel";
  EXPECT_EQ(bwd_sm90_group_split(shape(8, 8, 8, 1024, 128, true), false, kH100Sms, kH100L2), 1) << "multi-head";
  EXPECT_EQ(bwd_sm90_group_split(shape(8, 32, 8, 1024, 128, true), false, 0, kH100L2), 1) << "no GPU facts";
}

// The order functions the kernel's BwdOrderSm90 takes.
TEST(BwdGroupSplit, TheGridOrderIsTheKernels) {
  EXPECT_TRUE(bwd_sm90_key_tile_fastest(false, false, 128, 8, kH100Sms)) << "unmasked: key tile fastest";
  EXPECT_FALSE(bwd_sm90_key_tile_fastest(false, true, 128, 8, kH100Sms)) << "masked: chunks in key-tile order";
  EXPECT_TRUE(bwd_sm90_key_tile_fastest(false, true, 192, 8, kH100Sms)) << "wide head dims";
  EXPECT_FALSE(bwd_sm90_key_tile_fastest(true, true, 192, 8, kH100Sms)) << "deterministic, the writer's turns";
  EXPECT_TRUE(bwd_sm90_key_tile_fastest(true, true, 256, 8, kH100Sms)) << "deterministic, the consumers' turns";
  EXPECT_FALSE(bwd_sm90_key_tile_fastest(true, false, 128, kH100Sms + 1, kH100Sms)) << "more key tiles than SMs";
  // Chunks of at least two waves of CTAs: 8 key tiles, 33 pairs a chunk.
  EXPECT_EQ(bwd_sm90_chunks(false, 8, 64, kH100Sms), 1);
  EXPECT_EQ(bwd_sm90_chunks(false, 8, 256, kH100Sms), 7);
  EXPECT_EQ(bwd_sm90_chunks(true, 8, 256, kH100Sms), 1);
}

}  // namespace
}  // namespace attnprof::cuda
