// The register-blocked block products and the online-softmax step of the CPU
// flash backend, written once over flash_simd.h's Vf (kLanes lanes) and
// compiled per instruction-set level inside ATTNPROF_ISA_NS. All operands
// are FP32 in scratch (or FP32 input rows read in place); the caller handles
// dtypes, strides and masks.
//
// Layouts (why they are transposed): the query block is packed transposed,
// Qt[d][i], once per query block. Then S^T = K Qt is a plain GEMM whose
// K operand is read row by row straight from the input (broadcast K[j][d],
// vector Qt[d][i..i+2 kLanes)), so K needs no per-block transpose; the online
// softmax runs down the columns of S^T, kLanes query rows per vector; and
// O += P V broadcasts P^T[j][i] (any layout broadcasts alike) against vector
// rows of V, again read in place. Each tile keeps kTileRows x 2 accumulators
// in registers (6 x 2 ymm with AVX2, 8 x 2 zmm with AVX-512): 2 vector loads
// and kTileRows broadcasts per 2 kTileRows FMAs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cpu/flash_simd.h"

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

// Calls fn(std::integral_constant<int, r>) for the run-time row count
// 1 <= rows < kTileRows: the tail tiles, each its own unrolled instance.
template <int MR = kTileRows - 1, class Fn>
inline void with_tail_rows(std::int64_t rows, Fn&& fn) {
  if constexpr (MR >= 1) {
    if (rows == MR) {
      fn(std::integral_constant<int, MR>{});
    } else {
      with_tail_rows<MR - 1>(rows, fn);
    }
  }
}

// st[r][0..2 kLanes) = sum_d k[r][d] * qt[d][0..2 kLanes) for r < MR (one tile of S^T);
// with colmax, colmax[0..2 kLanes) also takes the tile's column maxima.
template <int MR>
inline void qk_tile(const float* k, std::int64_t ldk, const float* qt, std::int64_t ldq, std::int64_t depth, float* st,
                    std::int64_t lds, float* colmax) {
  Vf acc[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = zeros();
  for (std::int64_t d = 0; d < depth; ++d) {
    const Vf q0 = load(qt + d * ldq);
    const Vf q1 = load(qt + d * ldq + kLanes);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const Vf kr = broadcast(k + r * ldk + d);
      acc[r][0] = fma(kr, q0, acc[r][0]);
      acc[r][1] = fma(kr, q1, acc[r][1]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    store(st + r * lds, acc[r][0]);
    store(st + r * lds + kLanes, acc[r][1]);
  }
  if (!colmax) return;
  // From the registers the products left. A plain fold over the rows: a
  // tree's loop (step doubling) was not unrolled by GCC 12 at 6 rows, which
  // then kept the accumulators in memory through the products (AVX2: 19% slower).
  Vf m0 = load(colmax);
  Vf m1 = load(colmax + kLanes);
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    m0 = max(m0, acc[r][0]);
    m1 = max(m1, acc[r][1]);
  }
  store(colmax, m0);
  store(colmax + kLanes, m1);
}

// Rows the next pass will read (V during S^T = K Qt), fetched into L2 a few
// at a time between tiles, so PV does not wait on L3 row after row and the
// prefetches never queue up in one burst.
struct Prefetch {
  const float* rows = nullptr;  // null: nothing to fetch
  std::int64_t ld = 0;
  std::int64_t floats = 0;  // per row
  void rows_at(std::int64_t first, std::int64_t count) const {
    if (!rows) return;
    for (std::int64_t j = first; j < first + count; ++j)
      for (std::int64_t c = 0; c < floats; c += 16) __builtin_prefetch(rows + j * ld + c, 0, 2);
  }
};

// Query columns per S^T tile: forward blocks round their columns up to it.
constexpr std::int64_t kQkCols = 2 * kLanes;

// S^T[0..n)[0..qcols) = K[0..n) Qt, qcols a multiple of kQkCols; with
// colmax, colmax[0..qcols) = S^T's column maxima (online_softmax's block max,
// taken from the registers instead of a pass over S^T).
inline void qk_block(const float* k, std::int64_t ldk, std::int64_t n, const float* qt, std::int64_t ldq,
                     std::int64_t qcols, std::int64_t depth, float* st, std::int64_t lds, const Prefetch& next = {},
                     float* colmax = nullptr) {
  if (colmax) std::fill(colmax, colmax + qcols, kNegInf);
  const auto col = [colmax](std::int64_t c) { return colmax ? colmax + c : nullptr; };
  std::int64_t j = 0;
  for (; j + kTileRows <= n; j += kTileRows) {
    next.rows_at(j, kTileRows);
    for (std::int64_t c = 0; c < qcols; c += kQkCols)
      qk_tile<kTileRows>(k + j * ldk, ldk, qt + c, ldq, depth, st + j * lds + c, lds, col(c));
  }
  next.rows_at(j, n - j);
  if (j == n) return;
  const float* kj = k + j * ldk;
  with_tail_rows(n - j, [&](auto mr) {
    for (std::int64_t c = 0; c < qcols; c += kQkCols)
      qk_tile<decltype(mr)::value>(kj, ldk, qt + c, ldq, depth, st + j * lds + c, lds, col(c));
  });
}

// o[r][0..kLanes NV) = alpha[r] * o[r] + sum_j pt[j][r] * v[j][0..kLanes NV) for r < MR.
template <int MR, int NV>
inline void pv_tile(const float* pt, std::int64_t ldp, const float* v, std::int64_t ldv, std::int64_t n,
                    const float* alpha, float* o, std::int64_t ldo) {
  Vf acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    const Vf a = broadcast(alpha + r);
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) acc[r][c] = mul(a, load(o + r * ldo + kLanes * c));
  }
  for (std::int64_t j = 0; j < n; ++j) {
    Vf vj[NV];
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) vj[c] = load(v + j * ldv + kLanes * c);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const Vf p = broadcast(pt + j * ldp + r);
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = fma(p, vj[c], acc[r][c]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) store(o + r * ldo + kLanes * c, acc[r][c]);
}

template <int NV>
inline void pv_strip(const float* pt, std::int64_t ldp, const float* v, std::int64_t ldv, std::int64_t n,
                     std::int64_t rows, const float* alpha, float* o, std::int64_t ldo) {
  std::int64_t i = 0;
  for (; i + kTileRows <= rows; i += kTileRows)
    pv_tile<kTileRows, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
  if (i == rows) return;
  with_tail_rows(rows - i, [&](auto mr) {
    pv_tile<decltype(mr)::value, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
  });
}

// O[0..rows)[0..dpad) = diag(alpha) O + P V with P^T given (n keys by ldp),
// dpad a multiple of kLanes. Column strips outermost: one strip of V (n x 2
// kLanes floats, 8-16 KiB for 128 keys) stays in L1 while every row tile
// streams P^T.
inline void pv_block(const float* pt, std::int64_t ldp, const float* v, std::int64_t ldv, std::int64_t n,
                     std::int64_t rows, std::int64_t dpad, const float* alpha, float* o, std::int64_t ldo) {
  std::int64_t c = 0;
  for (; c + 2 * kLanes <= dpad; c += 2 * kLanes) pv_strip<2>(pt, ldp, v + c, ldv, n, rows, alpha, o + c, ldo);
  if (c < dpad) pv_strip<1>(pt, ldp, v + c, ldv, n, rows, alpha, o + c, ldo);
}

// P written over S^T in place: online_softmax's default sink.
struct PInPlace {
  float* st;
  std::int64_t lds;
  void operator()(std::int64_t j, std::int64_t c, Vf p0, Vf p1) const {
    store(st + j * lds + c, p0);
    store(st + (j + 1) * lds + c, p1);
  }
  void tail(std::int64_t j, std::int64_t c, Vf p0) const { store(st + j * lds + c, p0); }
};

// How far a block's max may pass the running shift before the shift moves
// to it (base-2 logits): P = 2^(s - m) is then at most 2^8, well inside
// FP32's and bf16's range, and m is at most 8 below the true max (the
// log-sum-exp and the normalisation use the m the sums were taken against,
// so nothing else changes). FlashAttention-4 skips its rescales the same way.
constexpr float kMaxLead = 8.0f;

// The online-softmax step on one key block: for each query column of S^T
// (base-2 logits once multiplied by `scale`, masked entries -inf), the new
// running shift m (kMaxLead says when it moves), the factor
// alpha = 2^(m_old - m_new) that rescales the accumulator and the sum l, and
// P = 2^(scale S - m_new), handed to
// sink(j, c, P[j], P[j + 1]) a pair of key rows at a time and sink.tail(j,
// c, P[j]) for an odd last one (PInPlace: over S^T). qcols is a multiple of
// kLanes. The scale rides in the exponent's FMA and the max (scale > 0 only), so
// a caller whose scores need no other scaled step passes it here instead of
// a pass over S^T; with scale 1 P is what s - m_new gives, bit for bit.
// kBf16P: P is rounded to bf16 for P V (exp2's shorter polynomial).
template <bool kBf16P = false, class Sink>
inline void online_softmax(const float* st, std::int64_t lds, std::int64_t n, std::int64_t qcols, float* m, float* l,
                           float* alpha, float scale, const Sink& sink, const float* colmax = nullptr) {
  const Vf sc = splat(scale);
  const bool exact_product = scale == 1.0f;
  for (std::int64_t c = 0; c < qcols; c += kLanes) {
    const Vf m_old = load(m + c);
    Vf tile_max;
    if (colmax) {
      tile_max = load(colmax + c);
    } else {
      // Four chains: VMAXPS's 4-cycle latency, not its ports, bounded two.
      Vf block_max[4] = {splat(kNegInf), splat(kNegInf), splat(kNegInf), splat(kNegInf)};
      std::int64_t j = 0;
      for (; j + 4 <= n; j += 4)
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) block_max[u] = max(block_max[u], load(st + (j + u) * lds + c));
      for (; j < n; ++j) block_max[0] = max(block_max[0], load(st + j * lds + c));
      tile_max = max(max(block_max[0], block_max[1]), max(block_max[2], block_max[3]));
    }
    // The shift moves only where the block's max passes it by more than
    // kMaxLead, and then to that max: P stays at most 2^kMaxLead, and alpha
    // is exactly 1 on every other block, so the accumulator's rescale can be
    // skipped there (the AMX kernel's O^T in memory).
    const Vf block = mul(sc, tile_max);
    const Vf m_new = select_greater(block, add(m_old, splat(kMaxLead)), block, m_old);
    const Vf shift = finite_or_zero(m_new);
    const Vf neg_shift = sub(zeros(), shift);
    const Vf a = exp2(sub(m_old, shift));
    Vf sum0 = zeros();
    Vf sum1 = zeros();
    // P = 2^(scale s - shift). One FMA takes the exact product scale x s,
    // while the shift is scale x max rounded to FP32: up to half an ulp apart
    // for the max's own score, harmless while the shift is below 2^24 (half
    // an ulp at most 1/2), but from 2^31 on enough to take P past FP32 or
    // to 0 (bf16 q and k near 2^20 at scale 1 gave NaN rows; issue 57 item 6).
    // There the product is rounded first, as the max was, so the max's P is
    // exactly 1 again; a scale of 1 (scores scaled beforehand) is exact
    // either way. Below 2^24 nothing changes, bits included.
    const auto step = [&](auto rounded_product) {
      const auto p_of = [&](std::int64_t j) {
        const Vf s = load(st + j * lds + c);
        if constexpr (decltype(rounded_product)::value) {
          Vf product = mul(s, sc);
          // Kept a product: GCC's default -ffp-contract=fast would fuse it
          // into the subtraction, an FMA again.
          asm("" : "+m"(product));
          return exp2<kBf16P>(sub(product, shift));
        } else {
          return exp2<kBf16P>(fma(s, sc, neg_shift));
        }
      };
      std::int64_t j = 0;
      for (; j + 2 <= n; j += 2) {
        const Vf p0 = p_of(j);
        const Vf p1 = p_of(j + 1);
        sink(j, c, p0, p1);
        sum0 = add(sum0, p0);
        sum1 = add(sum1, p1);
      }
      if (j < n) {
        const Vf p0 = p_of(j);
        sink.tail(j, c, p0);
        sum0 = add(sum0, p0);
      }
    };
    if (!exact_product && hsum(select_greater(mul(shift, shift), splat(0x1p48f), splat(1.0f), zeros())) > 0.0f) {
      step(std::true_type{});
    } else {
      step(std::false_type{});
    }
    store(m + c, m_new);
    store(alpha + c, a);
    store(l + c, fma(load(l + c), a, add(sum0, sum1)));
  }
}

// The step on scores already scaled, P over S^T; colmax: the block's column
// maxima where the caller has them (qk_block's).
template <bool kBf16P = false>
inline void online_softmax(float* st, std::int64_t lds, std::int64_t n, std::int64_t qcols, float* m, float* l,
                           float* alpha, const float* colmax = nullptr) {
  online_softmax<kBf16P>(st, lds, n, qcols, m, l, alpha, 1.0f, PInPlace{st, lds}, colmax);
}

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
