// The range of soft caps and scales on which every backend's kernels are
// correct (against the float64 reference, within each backend's tolerance),
// for Problem validation to refuse anything outside, by field name; and the
// inputs' side of it (scores_in_range), which is the caller's to keep.
//
// Why these bounds. The kernels hold the cap, the scale and their products
// in FP32 (and the GPUs flush subnormals to zero):
//  - CPU flash: cap2 = cap log2(e) and 1 / cap2, the scores' q_scale =
//    scale log2(e) (times FP8 descales);
//  - the CUDA fused kernels (efficient, flash sm80/sm90): scale_log2 =
//    cap log2(e) or scale log2(e), and softcap_in = scale / cap;
//  - cuDNN: the cap as an FP32 pointwise operand, s / cap and cap tanh;
//  - the composites (naive, naive_inplace, math): mul by 1 / cap, tanh, mul by
//    cap, in the scores' dtype (FP32 for math, the input dtype for naive).
// With 2^-60 <= cap <= 2^60 and 2^-60 <= |scale| <= 2^60 every one of those
// is a normal FP32 value with margin (scale / cap within 2^+-120, 1 / cap2
// at least 2^-61), so nothing overflows to inf (the old 3.4e38 cap: cap2 =
// inf, then inf * 0 = NaN) and nothing underflows to 0 (the old 1e-300 cap
// became cap2 = 0, read as "no cap"). A score s / cap that overflows for a
// tiny cap gives tanh = +-1, the right limit; one that flushes to zero for a
// huge cap is a capped logit under 2^-126 cap <= 2^-66 in magnitude, whose
// loss changes no probability in FP32. (FP8's descales multiply the CPU
// flash's q_scale too: they are checked finite and positive on their own.)
// fp16 keeps less: naive's scores are fp16, whose smallest subnormal is
// 2^-24, so s / cap for a cap past 2^10 loses the low bits of every score
// (cap 2^60 flushes them all to 0: uniform attention). fp16 caps stop at 2^10.
// The scale's existing bound, |scale| x head_dim within the scores' dtype
// (Problem::validate), still applies on top of these.
//
// The inputs' side of the range (issue 57 item 6). A scale in range is not
// enough: with finite q and k of any size a score overflows FP32 somewhere.
// Every backend computes a finite result from finite inputs (and the right
// one, within its tolerance) while
//     max(1, |scale|) x head_dim x max|q| x max(1, max|k|) <= scores_abs_max(dtype),
// 2^126 where the scores are FP32 and every kernel rounds its products (fp32,
// fp8), 2^30 for bf16 and 65504 for fp16 (naive's scores are fp16). That
// bounds every partial sum of q . k and of scale x q . k, in whatever order a
// GEMM takes them, and scale x q (the CPU flash's pre-scaled q). bf16's
// bound is the CUDA fused kernels' (softmax_online.cuh): they take each
// exponent as one FMA against the row max's product rounded to FP32, so the
// max's own p is 2^(that rounding, up to half an ulp of the base), finite
// while the base-2 logit, scale x q . k x log2(e), stays below 2^31 (2^30
// times log2 e is 2^30.53). Rounding every product first holds to 2^126, as
// the CPU kernels and FP8's do, but cost the H100's bf16 forward 4-6%
// (docs/perf/forward.md, 2026-12-07). Past the bound a row is NaN, never zeros or
// another finite answer: a fused kernel's row whose p under- or overflowed
// is written NaN (OnlineSoftmax::finish), and past 2^128 a score becomes inf
// in some kernel and its row's softmax inf - inf = NaN, as SDPA's float32 is;
// which rows reach NaN first depends on each kernel's order of operations.
// Scale 2^60 with |q| near 1e20 (2^66) is far past it. No call reads q and k
// to check this (a pass over both on every call, and a host read of a GPU's);
// the profiler's own inputs, uniform in [-1, 1), are kept inside it by
// Problem::validate's bound on |scale| x head_dim.
// The bound is the forward's. A fused backward recomputes P from the
// forward's log-sum-exp, held in FP32 (natural log): its rounding, a relative
// 2^-24, moves every recomputed P by |lse| 2^-24 in the exponent, so the
// gradients drift from float64 long before the forward does (CPU flash, q
// and k uniform, scale 1, measured 2026-12-07: dQ off by a relative 8e-4 at
// scores near 2^11, dV by 0.15 near 2^23, NaN near 2^31 on some levels).
// Training keeps its scores far below this bound; no kernel changes that.
#pragma once

#include <cstdint>

#include "attnprof/dtype.h"

namespace attnprof::limits {

inline constexpr double kSoftcapMin = 0x1p-60;  // about 8.7e-19
inline constexpr double kSoftcapMax = 0x1p60;   // about 1.15e18
inline constexpr double kSoftcapMaxF16 = 0x1p10;
inline constexpr double kScaleAbsMin = 0x1p-60;
inline constexpr double kScaleAbsMax = 0x1p60;

// The longest sequence (seq, kv_seq, a packed batch's max_seqlen) a problem
// may have: a limit that catches typos (a seq of 10^9) before anything is
// sized from it (Problem::validate; the bindings name their own arguments).
inline constexpr std::int64_t kMaxSeq = std::int64_t{1} << 22;

// The largest soft cap every backend computes correctly for inputs of `dtype`.
constexpr double softcap_max(DType dtype) { return dtype == DType::F16 ? kSoftcapMaxF16 : kSoftcapMax; }

// Whether a soft cap (0: none) or a scale is inside the range above.
constexpr bool softcap_in_range(double softcap, DType dtype) {
  return softcap == 0 || (softcap >= kSoftcapMin && softcap <= softcap_max(dtype));
}
constexpr bool scale_in_range(double scale) {
  const double a = scale < 0 ? -scale : scale;
  return a >= kScaleAbsMin && a <= kScaleAbsMax;
}

// The inputs' bound above: the largest max(1, |scale|) x head_dim x max|q| x
// max(1, max|k|) every backend computes finitely for inputs of `dtype`.
inline constexpr double kScoresAbsMax = 0x1p126;
inline constexpr double kScoresAbsMaxBF16 = 0x1p30;
inline constexpr double kScoresAbsMaxF16 = 65504.0;
constexpr double scores_abs_max(DType dtype) {
  return dtype == DType::F16 ? kScoresAbsMaxF16 : dtype == DType::BF16 ? kScoresAbsMaxBF16 : kScoresAbsMax;
}

// Whether inputs whose elements are at most max_abs_q (q) and max_abs_k (k)
// in magnitude lie inside it.
constexpr bool scores_in_range(DType dtype, double scale, std::int64_t head_dim, double max_abs_q, double max_abs_k) {
  const double s = scale < 0 ? -scale : scale;
  const double reach = (s > 1 ? s : 1) * static_cast<double>(head_dim) * max_abs_q * (max_abs_k > 1 ? max_abs_k : 1);
  return reach <= scores_abs_max(dtype);
}

}  // namespace attnprof::limits
