// flash's split-KV decode: how many key ranges the host cuts each sequence's
// keys into (decode_splits, fused_params.h). The choices below are the split
// counts each measured row ran fastest at, or near it (H100, 132 SMs, two
// decode CTAs an SM at head dim 128: docs/perf/decode.md, session 29), and the
// rule's limits on any GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backends/cuda/fused_params.h"

namespace attnprof::cuda {
namespace {

constexpr int kH100Sms = 132;

// (batch x KV heads) CTAs of one 16-row tile each, at `keys` keys (tiles of kFlashDecodeKeys).
int h100_splits(std::int64_t ctas, int keys, int per_sm = 2) {
  return decode_splits(ctas, kH100Sms, per_sm, (keys + kFlashDecodeKeys - 1) / kFlashDecodeKeys);
}

TEST(DecodeSplits, OneRangeAnSmWhileEachStaysShort) {
  EXPECT_EQ(h100_splits(8, 512), 8);    // 8 tiles: one each (7.9 us; 4 ranges of 2 tiles: 9.0)
  EXPECT_EQ(h100_splits(8, 2048), 16);  // 2 tiles each, one an SM (11.0 us; 32 of 1 tile two an SM: 13.1)
}

TEST(DecodeSplits, TheSharedSlotsWhereEachRangeKeepsItsPipeline) {
  EXPECT_EQ(h100_splits(8, 8192), 32);     // 4 tiles each, two an SM (19.6 us; 16 ranges: 20.8)
  EXPECT_EQ(h100_splits(8, 32768), 33);    // every slot (32 ranges: 57.9 us; 16: 63.7)
  EXPECT_EQ(h100_splits(32, 8192), 8);     // 4 x 8 KV heads (51.5 us; the wave rule's 7: 53.9)
  EXPECT_EQ(h100_splits(128, 2048), 2);    // 16 x 8: two an SM, 16 tiles each (53.5 us; 4 ranges: 56.5)
  EXPECT_EQ(h100_splits(8, 2048, 1), 16);  // one CTA an SM (head dim 256): the SMs only
  EXPECT_EQ(h100_splits(8, 8192, 1), 16);
}

TEST(DecodeSplits, ManyCtasBalanceTheLastWaveOrStayWhole) {
  EXPECT_EQ(h100_splits(160, 4096), 3);  // 160 CTAs on 264 slots: 3 ranges fill 1.8 waves
  EXPECT_EQ(h100_splits(512, 4096), 1);  // two waves or more of whole sequences
  EXPECT_EQ(h100_splits(211, 4096), 1);  // four fifths of the slots
}

TEST(DecodeSplits, NeverMoreRangesThanTilesOrTheCombineTakes) {
  for (const std::int64_t ctas :
       std::initializer_list<std::int64_t>{1, 2, 7, 8, 33, 64, 100, 131, 132, 200, 1000, std::int64_t{1} << 31}) {
    for (const int tiles : {0, 1, 2, 3, 5, 64, 1000, 100000}) {
      for (const int per_sm : {0, 1, 2, 3, 8}) {
        for (const int sms : {0, 1, 2, 108, 132, 170}) {
          const int s = decode_splits(ctas, sms, per_sm, tiles);
          EXPECT_GE(s, 1);
          EXPECT_LE(s, std::max(1, std::min(tiles, kFlashDecodeMaxSplits)))
              << ctas << " CTAs, " << tiles << " tiles, " << per_sm << " an SM, " << sms << " SMs";
        }
      }
    }
  }
  EXPECT_EQ(decode_splits(1, kH100Sms, 2, 1), 1);  // one tile: nothing to split
  static_assert(decode_splits(8, kH100Sms, 2, 32) == 16, "the rule is a constant expression");
}

}  // namespace
}  // namespace attnprof::cuda
