// The sm90a forward's tile configurations (FlashSm90Cfg): tile sizes, roles,
// stages, the soft-capped kernel's fixed base and where the row sums of P are
// taken; each head dim's default; and which problems take which kernel.
#pragma once

#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"

namespace attnprof::cuda::kernels {

// Tile sizes and roles of the sm90a forward: 64 query rows per consumer
// warpgroup (kConsumers of them), kBlockN keys a tile, kStages K/V stages.
// Measured on H200 (docs/perf/fused-kernels.md, run 8): a third stage and the
// rescale skip are within run-to-run spread of the default (2 consumers, 2
// stages); three consumers gain 4% at 4096x64, lose 7% at 1024x64, and at
// D = 128 the 416 threads cap ptxas at 128 registers, spill 1.1 KB and run
// at a third of the speed without setmaxnreg.
//
// kWgProducer: the producer is a whole warpgroup that gives its registers
// back (setmaxnreg.dec to kProducerRegs) so that the consumers may grow to
// kConsumerRegs (setmaxnreg.inc), FlashAttention-3's split; otherwise one
// producer warp and no register moves. kPingpong (2 consumers): the
// consumers take turns to issue their matrix products (two named barriers),
// so one's softmax runs under the other's GEMMs instead of both softmaxes at
// once. kIntraOverlap: each consumer issues the next tile's S = Q K^T and this
// tile's O += P V back to back and runs the next tile's softmax while P V
// works, FlashAttention-3's intra-warpgroup pipelining (it holds a second set
// of S registers, so it wants the producer warpgroup's registers).
//
// Head dims: the tiles hold whole 64-column swizzle regions, kPadDim
// columns; a head dim of 96 is padded to 128 (TMA fills the columns past the
// tensor with zeros, which add nothing to Q K^T, and O's padding columns are
// never stored). O += P V is issued in column chunks of 128 (and one of 64),
// so any kPadDim up to 256 fits wgmma's N.
template <int kHeadDim_, int kBlockN_, int kConsumers_ = 2, int kStages_ = 2, bool kSkipRescale_ = false,
          bool kWgProducer_ = false, bool kPingpong_ = false, bool kIntraOverlap_ = false, int kFmaExp2_ = 0,
          bool kCapFixedBase_ = false, bool kTensorRowSums_ = false>
struct FlashSm90Cfg {
  // Soft-capped bf16: the exponentials against a fixed base
  // (OnlineSoftmax::scores_fixed_base), no row max or rescale of O; a kernel
  // of its own (FlashSm90CappedCfg), launched where softcap_on_fixed_base.
  static constexpr bool kCapFixedBase = kCapFixedBase_;
  // The row sums of P from the tensor cores: P V with a tile of ones in
  // place of V (MainloopFwdSm90TmaWgmmaWs::issue_pv), one more accumulator
  // n-tile, which O's rescale takes with the rest; the softmax sums nothing.
  // The fixed base always takes them.
  static constexpr bool kTensorRowSums = kTensorRowSums_ || kCapFixedBase;
  // Of every 8 n-tiles of S, those whose exponentials run on the FMA pipe
  // (OnlineSoftmax's kFmaExp2): the FP8 kernel's MUFU time matches its tensor time.
  static constexpr int kFmaExp2 = kFmaExp2_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kPadDim = (kHeadDim + 63) / 64 * 64;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumers = kConsumers_;  // warpgroups of 64 query rows
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr bool kWgProducer = kWgProducer_;
  static constexpr bool kPingpong = kPingpong_;
  static constexpr bool kIntraOverlap = kIntraOverlap_;
  static constexpr int kProducerThreads = kWgProducer ? 128 : 32;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // setmaxnreg's counts (multiples of 8). The consumers grow only into what
  // the producer gave back: the CTA's pool is what it was launched with,
  // kLaunchRegs a thread (ptxas's cap under __launch_bounds__(kThreads, 1)),
  // not the whole register file. Asking for more blocks setmaxnreg.inc for
  // good (the H200 hung at 32 + 240 with 168 a thread: 18432 registers
  // wanted, 17408 given back). 2 consumers: 24 + 240, FlashAttention-3's.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegsFit =
      (kLaunchRegs * kThreads - kProducerThreads * kProducerRegs) / kConsumerThreads / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsFit < 240 ? kConsumerRegsFit : 240;
  static_assert(!kWgProducer || kConsumerRegs >= kLaunchRegs, "setmaxnreg.inc must not shrink the consumers");
  static constexpr int kStages = kStages_;
  // OnlineSoftmax::update's skip; the overlapped loop skips its own rescale
  // likewise (O times alpha, when no row of the warp grew its max).
  static constexpr bool kSkipRescale = kSkipRescale_;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kPadDim / 8;
  // O's accumulator n-tiles, then (kTensorRowSums) one of the row sums of P.
  static constexpr int kAccTiles = kDTiles + (kTensorRowSums ? 1 : 0);
  static_assert(kNTiles == 8 || kNTiles == 10 || kNTiles == 16 || kNTiles == 24, "wgmma N of S: 64, 80, 128 or 192");
  static_assert(kPadDim <= 256, "O's accumulators: 64 rows x at most 256 columns a warpgroup");
  static_assert(!kPingpong || kConsumers == 2, "pingpong takes two consumer warpgroups");
};

// The tile shape each head dim runs with (docs/perf/fused-kernels.md, runs 7-12):
// FlashAttention-3's producer warpgroup, intra-warpgroup overlap and pingpong
// (run 12: 633-701 TFLOP/s at D = 128, from 550-606 without the overlap).
// D = 192 and 256 take 80-key tiles (FlashAttention-3's 128 x 80: +3-4% over
// 64-key ones, run 12; 128 do not fit in shared memory); at D = 256
// pingpong is within 2% either way and left out.
template <int kHeadDim>
struct FlashSm90DefaultCfgOf {
  using type = FlashSm90Cfg<kHeadDim, 128, 2, 2, false, true, true, true>;
};
template <>
struct FlashSm90DefaultCfgOf<192> {
  using type = FlashSm90Cfg<192, 80, 2, 2, false, true, true, true>;
};
template <>
struct FlashSm90DefaultCfgOf<256> {
  using type = FlashSm90Cfg<256, 80, 2, 2, false, true, false, true>;
};
template <int kHeadDim>
using FlashSm90DefaultCfg = typename FlashSm90DefaultCfgOf<kHeadDim>::type;

// Cfg's soft-capped kernel: its tiles and roles, the fixed base, kFmaExp2
// of every 8 n-tiles' exponentials on the FMA pipe, and whether its
// consumers take turns (kPingpong).
template <class Cfg, int kFmaExp2 = Cfg::kFmaExp2, bool kPingpong = Cfg::kPingpong>
using FlashSm90CappedCfg = FlashSm90Cfg<Cfg::kHeadDim, Cfg::kBlockN, Cfg::kConsumers, Cfg::kStages, Cfg::kSkipRescale,
                                        Cfg::kWgProducer, kPingpong, Cfg::kIntraOverlap, kFmaExp2, true>;

// Whether a soft-capped problem takes the fixed-base kernel: a cap whose
// c log2 e (a capped problem's scale_log2) is within the bound.
inline bool softcap_on_fixed_base(const FwdArgs& a) {
  return a.softcap_in != 0.f && a.scale_log2 <= kCapFixedBaseMaxLog2;
}

// Whether the default takes the persistent tile scheduler (tile_scheduler.cuh):
// at D = 64, where tiles are short, it gains 3-18% (run 12: 218 -> 258
// TFLOP/s at 8x16x1024 causal, 372 -> 388 at 4x16x4096 causal, 430 -> 444 at
// 16x16x2048 non-causal); at D = 128 and 256 it loses 12-20% on the long
// causal rows (its fixed stride leaves the last CTAs alone).
template <int kHeadDim>
inline constexpr bool kFlashSm90PersistentDefault = kHeadDim == 64;

}  // namespace attnprof::cuda::kernels
