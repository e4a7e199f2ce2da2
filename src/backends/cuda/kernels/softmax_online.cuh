// Online softmax over a warp's S fragments, in registers (FlashAttention's
// running max and running sum). Each thread holds two rows per 16-row m-tile
// (fragment rows g and g+8); a row's 8 columns of one n-tile live in the 4
// threads of a quad, so row reductions are two xor-shuffles.
//
// Scores stay unscaled until the exponent: p = 2^(s*scale*log2e - max*scale*log2e),
// the base (the row max's product) rounded to FP32 and each score's exponent
// one FMA against it: one FFMA and one MUFU per element. Requires scale > 0
// (so max(s) gives max(s*scale)). The max's own exponent is then its
// product's rounding error, up to half an ulp of the base: 2^(+-0.5) below
// base 2^24, 2^(+-64) below 2^31, past ex2's range (p = inf, the row NaN)
// from base 2^31 on. limits.h's scores_in_range keeps bf16 and fp16 scores
// below that (2^30 times log2 e). Rounding each product first (FMUL, FADD)
// would hold to 2^126, as the CPU kernels do, but cost the H100's forward
// 4-6% (docs/perf/forward.md, 2026-12-07); FP8 takes it (exponent(), below), whose
// P has no room above 2^kLog2Offset. The per-row factors (the base, alpha,
// the log-sum-exp) take the rounded product (scaled()), so a max that did
// not grow rescales by exactly 1.
// A row that has seen only masked keys keeps max = -inf; its exponent base is
// taken as 0, so its p are 0, its sum stays 0 and it is written as zeros.
// NaN passes through as in the float64 reference: the max (fmaxf) skips a
// NaN score, but its exponential is NaN, so the row's sum is NaN, and the
// epilogue's tests are sum != 0 (not sum > 0), so a NaN sum gives a NaN row
// and a NaN log-sum-exp where a zero sum gives zeros. No cost in the loop.
// Fragment layout: mma.m16n8k16's C (mma_sm80.cuh), which wgmma's
// accumulators share (wgmma_sm90.cuh), so both architectures use this.
#pragma once

#include "backends/cuda/kernels/utils.cuh"

namespace attnprof::cuda::kernels {

// Pairwise reduction of n values: ceil(log2(n)) dependent steps
// instead of n - 1. With two warps a scheduler little else hides the latency
// of the row max and row sum chains (H200, flash D = 128, 128x64 tiles,
// non-causal 2x16x8192: 3.16-3.20 ms with trees, 3.24 ms with sequential chains).
// (Written as a recursion on the width: a loop whose width halves was left
// partly rolled at 16 values, with the array in local memory.)
template <int kWidth, int kN, class Op>
__device__ __forceinline__ void tree_reduce_step(float (&v)[kN], Op op) {
  if constexpr (kWidth > 0) {
#pragma unroll
    for (int i = 0; i < kWidth; ++i) v[i] = op(v[i], v[i + kWidth]);
    tree_reduce_step<kWidth / 2>(v, op);
  }
}

// Any n: the values past the largest power of two below n are folded into
// the first ones, then the power of two is reduced.
constexpr int pow2_floor(int n) { return n < 2 ? 1 : 2 * pow2_floor(n / 2); }

template <int kN, class Op>
__device__ __forceinline__ float tree_reduce(float (&v)[kN], Op op) {
  constexpr int kPow2 = pow2_floor(kN);
#pragma unroll
  for (int i = 0; i < kN - kPow2; ++i) v[i] = op(v[i], v[i + kPow2]);
  tree_reduce_step<kPow2 / 2>(v, op);
  return v[0];
}

// 2^x on the FMA pipe, for the share of a tile's exponentials that the MUFU
// unit (16 a clock an SM, as many as the FP8 tensor cores' products need)
// should not take: x = n + f with n = rint(x) (the 1.5 x 2^23 rounding
// trick), 2^f on [-1/2, 1/2] by a degree-3 minimax polynomial (relative error
// below 1e-4, under e4m3's 2^-4 and bf16's 2^-8 that P is rounded to), times
// 2^n made from n's exponent bits. x below -127 (a masked -inf) gives exactly
// +0 (2^n's bits are 0 there); a NaN gives NaN, as ex2 does: the clamp is
// max.NaN (one FMNMX, as fmaxf, which would drop the NaN and make a NaN
// score's p 0), and p times 2^n keeps it, where adding n to p's bits as
// integers wrapped a NaN into FLT_MAX. (The multiply takes the place of
// that integer add: no instruction more.)
__device__ __forceinline__ float ex2_fma(float x) {
  asm("max.NaN.f32 %0, %0, 0fC2FE0000;\n" : "+f"(x));  // max(x, -127), NaN if x is
  const float t = x + 12582912.f;                      // 1.5 x 2^23: rint(x) in the low mantissa bits
  const float f = x - (t - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.0555041086f, f, 0.2402264923f), f, 0.6931471806f), f, 1.0f);
  const int biased = __float_as_int(t) - (0x4B400000 - 127);  // n + 127: 2^n's exponent field, 0 at n = -127
  return p * __int_as_float(biased << 23);
}

// x * scale_log2 rounded to FP32, never fused into the subtraction that
// follows it (__fmul_rn is not contracted into an FMA): a row's base and
// factors, and FP8's exponents (above).
__device__ __forceinline__ float scaled(float x, float scale_log2) { return __fmul_rn(x, scale_log2); }

// The largest cap c log2 e whose scores take OnlineSoftmax::scores_fixed_base.
inline constexpr float kCapFixedBaseMaxLog2 = 80.f;

// kLog2Offset: p is 2^kLog2Offset times the probability (FP8's P, packed
// into e4m3, whose normal range starts at 2^-6: FlashAttention-3's
// max_offset); the row sums carry the same factor, so O / sum is unchanged,
// and the log-sum-exp takes it back. kFmaExp2: of every 8 n-tiles, the first
// kFmaExp2 take their exponentials on the FMA pipe (ex2_fma).
template <int kMTiles, int kLog2Offset = 0, int kFmaExp2 = 0>
struct OnlineSoftmax {
  static_assert(kFmaExp2 >= 0 && kFmaExp2 <= 8);
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];  // this thread's partial sums; reduced over the quad in finish()
  bool fixed_base = false;    // fix_base(): a zero sum is a fully masked row whatever row_max says

  // A score's exponent against its row's base (below). FP8's P: the product
  // rounded first, so the row max's own p is exactly 2^kLog2Offset (e4m3's
  // 448 leaves it no margin). Otherwise one FMA, the exact product less the
  // base: a score's p is exact against the base, and the max's own is
  // 2^(its product's rounding error), finite while the base is below 2^31.
  __device__ __forceinline__ static float exponent(float s, float scale_log2, float base) {
    if constexpr (kLog2Offset != 0) {
      return scaled(s, scale_log2) - base;
    } else {
      return fmaf(s, scale_log2, -base);
    }
  }

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mt][h] = -INFINITY;
        row_sum[mt][h] = 0.f;
      }
    }
  }

  // Folds one tile of scores in: s becomes unnormalised probabilities, and o
  // (the running P*V) is rescaled to the new row maxima. kSkipUnchanged: see below.
  template <bool kSkipUnchanged, int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4], float (&o)[kMTiles][kDTiles][4],
                                         float scale_log2) {
    float alpha[kMTiles][2];
    const bool grew = scores(s, scale_log2, alpha);
    // A row whose max did not grow has alpha exactly 1 (2^0), and a row still
    // at -inf has o = 0; so when no row of the warp grew, the rescale of O
    // (D/2 multiplies per m-tile a thread) may be skipped. The branch also
    // stops the compiler from overlapping this tile's exponentials with the
    // P*V products, which cost more than the multiplies with two m-tiles a
    // warp (H200, D = 64, 128-row tiles: 0.544 ms with the skip, 0.512 without).
    if (!kSkipUnchanged || __any_sync(0xffffffffu, grew)) rescale(o, alpha);
  }

  // The first half of update, for a caller that rescales O later (the sm90
  // kernel's O is still being written by an asynchronous P V when the next
  // tile's scores arrive): the new row maxima, s exponentiated, the row sums
  // carried over, and alpha, the factor O must be multiplied by before this
  // tile's P V is added. Returns whether any row's max grew (this thread's rows).
  // !kSum: the caller takes the row sums elsewhere (the tensor cores), with O.
  template <bool kSum = true, int kNTiles>
  __device__ __forceinline__ bool scores(float (&s)[kMTiles][kNTiles][4], float scale_log2,
                                         float (&alpha)[kMTiles][2]) {
    bool grew = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float part[kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) part[nt] = fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
        float mx = fmaxf(row_max[mt][h], tree_reduce(part, [](float x, float y) { return fmaxf(x, y); }));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : scaled(mx, scale_log2) - static_cast<float>(kLog2Offset);
        // Old max -inf: alpha = 2^-inf = 0, and o, sum are still 0 anyway. A
        // max that did not grow gives alpha exactly 1 (the same rounded
        // product on both sides; an FMA here gave 2^(+-half an ulp of the
        // base), inf or 0 at large scores).
        alpha[mt][h] = ex2(scaled(row_max[mt][h], scale_log2) - static_cast<float>(kLog2Offset) - base);
        grew |= mx > row_max[mt][h];
        row_max[mt][h] = mx;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const bool on_fma = nt % 8 < kFmaExp2;
          const float x0 = exponent(s[mt][nt][2 * h], scale_log2, base);
          const float x1 = exponent(s[mt][nt][2 * h + 1], scale_log2, base);
          const float p0 = on_fma ? ex2_fma(x0) : ex2(x0);
          const float p1 = on_fma ? ex2_fma(x1) : ex2(x1);
          s[mt][nt][2 * h] = p0;
          s[mt][nt][2 * h + 1] = p1;
          if constexpr (kSum) part[nt] = p0 + p1;
        }
        if constexpr (kSum) {
          const float sum = tree_reduce(part, [](float x, float y) { return x + y; });
          row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
        }
      }
    }
    return grew;
  }

  // Soft-capped scores against a fixed base instead of the running max. A
  // capped score is c tanh(.), within (-c, c), so p = 2^(t scale_log2) (t the
  // tanh, scale_log2 = c log2 e = C) lies within [2^-C, 2^C] whatever the
  // row holds: while C <= kCapFixedBaseMaxLog2, neither P (bf16, fp32's
  // exponent range) nor the row sums and O can leave fp32's range for any
  // |V| within [2^-40, 2^24] (a row's largest p is at least 2^-C), and
  // nothing needs a row max, a reduction before the exponentials or a
  // rescale of O: each score's tanh and exponential issue back to back.
  // fp16's P (at most 2^16) does not take this. kTanh: s holds raw scores
  // (times softcap_in, then tanh here); otherwise s holds tanh already (a
  // masked tile: tanh, the mask, then this). kFmaShare: as kFmaExp2.
  // The row sums are not added here: the tensor cores take them beside P V
  // (P times a tile of ones, MainloopFwdSm90TmaWgmmaWs::issue_pv), so they
  // add p exactly as P V reads it, rounded to bf16, and a row of one key is
  // exactly its V. Summing p here instead (one FADD a score on the softmax's
  // path) cost 2-10% on the H200 and put a row's weights off by P's rounding
  // (docs/perf/issue22-2026-12-04.md).
  __device__ __forceinline__ void fix_base() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) row_max[mt][0] = row_max[mt][1] = 0.f;  // log_sum_exp's base
    fixed_base = true;
  }
  template <bool kTanh, int kFmaShare = kFmaExp2, int kNTiles>
  __device__ __forceinline__ void scores_fixed_base(float (&s)[kMTiles][kNTiles][4], float softcap_in,
                                                    float scale_log2) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float t = kTanh ? tanh_approx(s[mt][nt][2 * h + e] * softcap_in) : s[mt][nt][2 * h + e];
            s[mt][nt][2 * h + e] = nt % 8 < kFmaShare ? ex2_fma(t * scale_log2) : ex2(t * scale_log2);
          }
        }
      }
    }
  }

  // The second half: O times the alpha that scores() gave.
  template <int kDTiles>
  __device__ __forceinline__ static void rescale(float (&o)[kMTiles][kDTiles][4], const float (&alpha)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o[mt][dt][0] *= alpha[mt][0];
        o[mt][dt][1] *= alpha[mt][0];
        o[mt][dt][2] *= alpha[mt][1];
        o[mt][dt][3] *= alpha[mt][1];
      }
    }
  }

  // 1 / row sum for the epilogue, 0 for a fully masked row (output zeros, not
  // NaN). Leaves row_sum the whole row's sum, reduced over the quad. A row
  // that saw a finite score but whose sum is 0 or inf had its p under- or
  // overflow (base-2 logits past 2^31, outside limits.h's range: exponent()):
  // its sum becomes NaN, so the row and its log-sum-exp are NaN, never zeros
  // or another finite answer. Inside the range neither can happen (the max's
  // own p is within 2^(+-64)).
  __device__ __forceinline__ void finish(float (&inv)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = row_sum[mt][h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if ((sum == 0.f && !fixed_base && row_max[mt][h] != -INFINITY) || sum == INFINITY) {
          sum = __int_as_float(0x7fc00000);
        }
        row_sum[mt][h] = sum;
        inv[mt][h] = sum != 0.f ? 1.f / sum : 0.f;
      }
    }
  }

  // After finish(): each row's log-sum-exp of the scaled scores, natural log:
  // ln(sum_j e^(s_j * scale)) = (max * scale * log2e + log2(sum)) * ln2. A fully
  // masked row gets +inf, FlashAttention's convention: a backward's
  // exp(s - lse) is then 0 there, not NaN.
  __device__ __forceinline__ void log_sum_exp(float (&lse)[kMTiles][2], float scale_log2) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sum = row_sum[mt][h];
        lse[mt][h] = sum != 0.f
                         ? (scaled(row_max[mt][h], scale_log2) - static_cast<float>(kLog2Offset) + __log2f(sum)) *
                               0.6931471805599453f
                         : INFINITY;
      }
    }
  }
};

}  // namespace attnprof::cuda::kernels
