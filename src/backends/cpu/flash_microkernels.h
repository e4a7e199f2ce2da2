// The register-blocked block products and the online-softmax step of the CPU
// flash backend. All operands are FP32 in scratch (or FP32 input rows read in
// place); the caller handles dtypes, strides and masks.
//
// Layouts (why they are transposed): the query block is packed transposed,
// Qt[d][i], once per query block. Then S^T = K Qt is a plain GEMM whose
// K operand is read row by row straight from the input (broadcast K[j][d],
// vector Qt[d][i..i+16)), so K needs no per-block transpose; the online
// softmax runs down the columns of S^T, eight query rows per vector; and
// O += P V broadcasts P^T[j][i] (any layout broadcasts alike) against vector
// rows of V, again read in place. Each tile keeps 12 accumulators in
// registers: 6 rows by 16 columns, 2 vector loads and 6 broadcasts per 12 FMAs.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backends/cpu/flash_simd.h"

namespace attnprof::cpu::flash {

constexpr int kTileRows = 6;  // rows per register tile: 6 x 2 accumulators + 2 operands + 1 broadcast <= 16 ymm

// st[r][0..16) = sum_d k[r][d] * qt[d][0..16) for r < MR (one tile of S^T).
template <int MR>
inline void qk_tile(const float* k, std::int64_t ldk, const float* qt, std::int64_t ldq, std::int64_t depth, float* st,
                    std::int64_t lds) {
  F8 acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = zeros();
  for (std::int64_t d = 0; d < depth; ++d) {
    const F8 q0 = load(qt + d * ldq);
    const F8 q1 = load(qt + d * ldq + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const F8 kr = broadcast(k + r * ldk + d);
      acc[r][0] = fma(kr, q0, acc[r][0]);
      acc[r][1] = fma(kr, q1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    store(st + r * lds, acc[r][0]);
    store(st + r * lds + 8, acc[r][1]);
  }
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

// S^T[0..n)[0..qcols) = K[0..n) Qt, qcols a multiple of 16.
inline void qk_block(const float* k, std::int64_t ldk, std::int64_t n, const float* qt, std::int64_t ldq,
                     std::int64_t qcols, std::int64_t depth, float* st, std::int64_t lds, const Prefetch& next = {}) {
  std::int64_t j = 0;
  for (; j + kTileRows <= n; j += kTileRows) {
    next.rows_at(j, kTileRows);
    for (std::int64_t c = 0; c < qcols; c += 16)
      qk_tile<kTileRows>(k + j * ldk, ldk, qt + c, ldq, depth, st + j * lds + c, lds);
  }
  next.rows_at(j, n - j);
  for (std::int64_t c = 0; c < qcols && j < n; c += 16) {
    const float* kj = k + j * ldk;
    float* sj = st + j * lds + c;
    switch (n - j) {
      case 1:
        qk_tile<1>(kj, ldk, qt + c, ldq, depth, sj, lds);
        break;
      case 2:
        qk_tile<2>(kj, ldk, qt + c, ldq, depth, sj, lds);
        break;
      case 3:
        qk_tile<3>(kj, ldk, qt + c, ldq, depth, sj, lds);
        break;
      case 4:
        qk_tile<4>(kj, ldk, qt + c, ldq, depth, sj, lds);
        break;
      default:
        qk_tile<5>(kj, ldk, qt + c, ldq, depth, sj, lds);
        break;
    }
  }
}

// o[r][0..8*NV) = alpha[r] * o[r] + sum_j pt[j][r] * v[j][0..8*NV) for r < MR.
template <int MR, int NV>
inline void pv_tile(const float* pt, std::int64_t ldp, const float* v, std::int64_t ldv, std::int64_t n,
                    const float* alpha, float* o, std::int64_t ldo) {
  F8 acc[MR][NV];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    const F8 a = broadcast(alpha + r);
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) acc[r][c] = mul(a, load(o + r * ldo + 8 * c));
  }
  for (std::int64_t j = 0; j < n; ++j) {
    F8 vj[NV];
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) vj[c] = load(v + j * ldv + 8 * c);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const F8 p = broadcast(pt + j * ldp + r);
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = fma(p, vj[c], acc[r][c]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) store(o + r * ldo + 8 * c, acc[r][c]);
}

template <int NV>
inline void pv_strip(const float* pt, std::int64_t ldp, const float* v, std::int64_t ldv, std::int64_t n,
                     std::int64_t rows, const float* alpha, float* o, std::int64_t ldo) {
  std::int64_t i = 0;
  for (; i + kTileRows <= rows; i += kTileRows)
    pv_tile<kTileRows, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
  switch (rows - i) {
    case 0:
      break;
    case 1:
      pv_tile<1, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
      break;
    case 2:
      pv_tile<2, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
      break;
    case 3:
      pv_tile<3, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
      break;
    case 4:
      pv_tile<4, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
      break;
    default:
      pv_tile<5, NV>(pt + i, ldp, v, ldv, n, alpha + i, o + i * ldo, ldo);
      break;
  }
}

// O[0..rows)[0..dpad) = diag(alpha) O + P V with P^T given (n keys by ldp),
// dpad a multiple of 8. Column strips outermost: one strip of V (n x 16
// floats, 8 KiB for 128 keys) stays in L1 while every row tile streams P^T.
inline void pv_block(const float* pt, std::int64_t ldp, const float* v, std::int64_t ldv, std::int64_t n,
                     std::int64_t rows, std::int64_t dpad, const float* alpha, float* o, std::int64_t ldo) {
  std::int64_t c = 0;
  for (; c + 16 <= dpad; c += 16) pv_strip<2>(pt, ldp, v + c, ldv, n, rows, alpha, o + c, ldo);
  if (c < dpad) pv_strip<1>(pt, ldp, v + c, ldv, n, rows, alpha, o + c, ldo);
}

// The online-softmax step on one key block: for each query column of S^T
// (base-2 logits, masked entries -inf), the new running max m, the factor
// alpha = 2^(m_old - m_new) that rescales the accumulator and the sum l, and
// P = 2^(S - m_new) written over S^T. qcols is a multiple of 8.
inline void online_softmax(float* st, std::int64_t lds, std::int64_t n, std::int64_t qcols, float* m, float* l,
                           float* alpha) {
  for (std::int64_t c = 0; c < qcols; c += 8) {
    const F8 m_old = load(m + c);
    F8 block_max0 = splat(kNegInf);
    F8 block_max1 = splat(kNegInf);  // two chains hide the max latency
    std::int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
      block_max0 = max(block_max0, load(st + j * lds + c));
      block_max1 = max(block_max1, load(st + (j + 1) * lds + c));
    }
    if (j < n) block_max0 = max(block_max0, load(st + j * lds + c));
    const F8 m_new = max(m_old, max(block_max0, block_max1));
    const F8 shift = finite_or_zero(m_new);
    const F8 a = exp2(sub(m_old, shift));
    F8 sum0 = zeros();
    F8 sum1 = zeros();
    for (j = 0; j + 2 <= n; j += 2) {
      const F8 p0 = exp2(sub(load(st + j * lds + c), shift));
      const F8 p1 = exp2(sub(load(st + (j + 1) * lds + c), shift));
      store(st + j * lds + c, p0);
      store(st + (j + 1) * lds + c, p1);
      sum0 = add(sum0, p0);
      sum1 = add(sum1, p1);
    }
    if (j < n) {
      const F8 p0 = exp2(sub(load(st + j * lds + c), shift));
      store(st + j * lds + c, p0);
      sum0 = add(sum0, p0);
    }
    store(m + c, m_new);
    store(alpha + c, a);
    store(l + c, fma(load(l + c), a, add(sum0, sum1)));
  }
}

}  // namespace attnprof::cpu::flash
