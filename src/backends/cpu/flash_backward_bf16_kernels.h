// The CPU flash backward on bf16 products, for bf16 inputs: AVX512-BF16's
// VDPBF16PS (bf16 pairs multiplied and summed into FP32 lanes) or, at the
// amx level, AMX-BF16 tiles (TDPBF16PS, flash_amx_tiles.h's amx_gemm) for
// all five products of a work item, with FP32 accumulation, as the GPU
// kernels do. Compiled in the avx512bf16 and amx translation units only
// (flash_isa_table.h, ATTNPROF_ISA_BF16). Both take the same operands: a
// tile's A is 16 rows of 32 bf16 along the depth, its B 16 pairs in VNNI
// order, so the tiles need only zeros to whole tiles (key_block_bf16).
//
// The work item, its FP32 softmax step (P and dS), masking and dQ add are
// flash_backward_kernels.h's; only the operands and products differ. Q, K,
// V and dO are used as stored (no widening, no rounding); P^T and dS^T are
// rounded to bf16 once per block for the products that consume them. A
// VDPBF16PS product reads its A operand as broadcast pairs along the depth
// (any row-major bf16 rows) and its B operand as pairs in VNNI order, so
// each product's depth decides the layouts:
//   S^T  = K Q^T     depth D:      K rows;    Q^T pairs of dims,    qt2[p][i]
//   dP^T = V dO^T    depth D:      V rows;    dO^T pairs of dims,   dot2[p][i]
//   dV  += P^T dO    depth queries: P^T rows; dO pairs of queries,  dop[t][d]
//   dK  += dS^T Q    depth queries: dS^T rows; Q pairs of queries,  qp[t][d]
//   dQ^T = K^T dS^T  depth keys:   K^T rows;  dS^T pairs of keys,   dsp[t][i]
// (pair p of dims = elements 2p and 2p + 1, the low 16 bits the even one).
// K, V and K^T are packed once per item, the query side (Q and dO pairs)
// once per query block and head of the item, P^T and dS^T once per block.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/flash_backward_kernels.h"
#include "backends/cpu/flash_bf16_kernels.h"

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

// The bf16 products take what bf16_path takes (an even head_dim: pairs),
// with every tensor they read as bf16.
inline bool bf16_backward(const BackwardJob& job) {
  return bf16_path(job.p) && job.in.q.dtype() == DType::BF16 && job.in.k.dtype() == DType::BF16 &&
         job.in.v.dtype() == DType::BF16 && job.dout.dtype() == DType::BF16;
}

// Per-thread tiles, in floats (a bf16 region takes half a float an element):
// the FP32 layout first, whose P^T, dS^T, dK, dV, dQ^T and row stats the
// shared steps use (its K, V and query tiles stay unused here), then the
// bf16 operands.
struct BwdBf16Layout {
  BwdLayout f;
  std::int64_t k2 = 0, v2 = 0, kt2 = 0, qt2 = 0, dot2 = 0, qp = 0, dop = 0, pb = 0, dsb = 0, dsp = 0, rows = 0,
               total = 0;
};

inline BwdBf16Layout bwd_bf16_layout_for(std::int64_t head_dim) {
  const std::int64_t D = head_dim, dpad = dpad_of(head_dim);
  BwdBf16Layout L;
  L.f = bwd_layout_for(head_dim);
  const std::int64_t keys = L.f.block_k;
  ScratchLayout scratch{.total = L.f.total};
  const auto take = [&scratch](std::int64_t floats) { return scratch.take(floats); };
  L.k2 = take(keys * D / 2);         // K rows [keys][D]
  L.v2 = take(keys * D / 2);         // V rows [keys][D]
  L.kt2 = take(D * keys / 2);        // K^T rows [D][keys]
  L.qt2 = take(D / 2 * kBlockQ);     // uint32 [D / 2][kBlockQ]
  L.dot2 = take(D / 2 * kBlockQ);    // likewise
  L.qp = take(kBlockQ / 2 * dpad);   // uint32 [kBlockQ / 2][dpad]
  L.dop = take(kBlockQ / 2 * dpad);  // likewise
  L.pb = take(keys * kBlockQ / 2);   // P^T rows [keys][kBlockQ]
  L.dsb = take(keys * kBlockQ / 2);  // dS^T rows [keys][kBlockQ]
  L.dsp = take(keys / 2 * kBlockQ);  // uint32 [keys / 2][kBlockQ]
  L.rows = take(dpad);               // two query rows of dpad values, zero past D
  L.total = scratch.total;
  return L;
}

// Covers the FP32 layout too: the level's table has one scratch size per head_dim.
inline std::int64_t backward_scratch_bf16(std::int64_t head_dim) { return bwd_bf16_layout_for(head_dim).total; }

// ---- VDPBF16PS products: C (+)= A B over `pairs` pairs of depth ----------

// c[r][0..16 NV) (+)= sum_t a[r] pair t . b[t][0..16 NV) for r < MR: A's
// pairs broadcast, B's rows loaded as vectors; 12 x 2 accumulators, as the
// FP32 tiles.
template <int MR, int NV, bool kAccumulate>
inline void dot_tile(const std::uint16_t* a, std::int64_t lda, const std::uint32_t* b, std::int64_t ldb,
                     std::int64_t pairs, float* c, std::int64_t ldc) {
  __m512 acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (std::int64_t t = 0; t < pairs; ++t) {
    __m512bh bt[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bt[v] = as_bh(_mm512_loadu_si512(b + t * ldb + 16 * v));
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      std::int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * t, sizeof pair);
      const __m512bh ar = as_bh(_mm512_set1_epi32(pair));
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bt[v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

template <int NV, bool kAccumulate>
inline void dot_strip(const std::uint16_t* a, std::int64_t lda, const std::uint32_t* b, std::int64_t ldb,
                      std::int64_t rows, std::int64_t pairs, float* c, std::int64_t ldc) {
  std::int64_t r = 0;
  for (; r + kBf16TileRows <= rows; r += kBf16TileRows)
    dot_tile<kBf16TileRows, NV, kAccumulate>(a + r * lda, lda, b, ldb, pairs, c + r * ldc, ldc);
  if (r == rows) return;
  with_tail_rows<kBf16TileRows - 1>(rows - r, [&](auto mr) {
    dot_tile<decltype(mr)::value, NV, kAccumulate>(a + r * lda, lda, b, ldb, pairs, c + r * ldc, ldc);
  });
}

// C[rows x cols] (+)= A[rows x 2 pairs] B[pairs x cols], cols a multiple of
// 16. Column strips outermost, as the FP32 gemm: one strip of B stays in L1
// while every row tile streams A.
template <bool kAccumulate>
inline void dot_gemm(const std::uint16_t* a, std::int64_t lda, const std::uint32_t* b, std::int64_t ldb,
                     std::int64_t rows, std::int64_t cols, std::int64_t pairs, float* c, std::int64_t ldc) {
  std::int64_t col = 0;
  for (; col + 32 <= cols; col += 32) dot_strip<2, kAccumulate>(a, lda, b + col, ldb, rows, pairs, c + col, ldc);
  if (col < cols) dot_strip<1, kAccumulate>(a, lda, b + col, ldb, rows, pairs, c + col, ldc);
}

// One of the item's products on the level's instructions: AMX tiles (rows
// rounded up to 16, pairs to 16: the operands' padding is key_block_bf16's)
// or VDPBF16PS register tiles.
template <bool kAccumulate>
inline void bf16_product([[maybe_unused]] bool amx, const std::uint16_t* a, std::int64_t lda, const std::uint32_t* b,
                         std::int64_t ldb, std::int64_t rows, std::int64_t cols, std::int64_t pairs, float* c,
                         std::int64_t ldc) {
#if ATTNPROF_FLASH_AMX
  if (amx) return amx_gemm<kAccumulate>(a, lda, b, ldb, round_up(rows, 16), cols, round_up(pairs, 16), c, ldc);
#endif
  dot_gemm<kAccumulate>(a, lda, b, ldb, rows, cols, pairs, c, ldc);
}

// ---- Packing ---------------------------------------------------------------

// Row i of bf16 tensor t[b, h] (n values) copied as stored into dst.
inline void copy_bf16_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n,
                          std::uint16_t* dst) {
  const std::uint16_t* src = t.data_as<const std::uint16_t>() + t.index(b, h, i, 0);
  const std::int64_t inc = t.stride(3);
  if (inc == 1) {
    std::copy(src, src + n, dst);
  } else {
    for (std::int64_t d = 0; d < n; ++d) dst[d] = src[d * inc];
  }
}

// The item's K and V rows, and K^T with zero keys after its count up to
// `kt_keys` (the last pair of keys of dQ^T's depth; AMX: its last tile).
inline void pack_keys(const BackwardJob& job, const Sequence& s, std::int64_t hk, const KeySpan& keys,
                      std::int64_t kt_keys, const BwdBf16Layout& L, float* scratch) {
  const std::int64_t D = job.p.head_dim, block_k = L.f.block_k;
  auto* k = reinterpret_cast<std::uint16_t*>(scratch + L.k2);
  auto* v = reinterpret_cast<std::uint16_t*>(scratch + L.v2);
  auto* kt = reinterpret_cast<std::uint16_t*>(scratch + L.kt2);
  for (std::int64_t j = 0; j < keys.n; ++j) {
    copy_bf16_row(job.in.k, s.tb, hk, s.k0 + keys.j0 + j, D, k + j * D);
    copy_bf16_row(job.in.v, s.tb, hk, s.k0 + keys.j0 + j, D, v + j * D);
    for (std::int64_t d = 0; d < D; ++d) kt[d * block_k + j] = k[j * D + d];
  }
  for (std::int64_t d = 0; d < D; ++d)
    std::fill(kt + d * block_k + keys.n, kt + d * block_k + kt_keys, std::uint16_t{0});
}

// Query rows i0..i0+nq of bf16 tensor t (Q or dO) for head h, zero past nq
// up to qcols: pairs of dims transposed, dims2[p][i], and pairs of queries,
// queries2[t][d] (zero past D up to dpad). Two rows at a time through `rows`.
inline void pack_query_pairs(const BackwardJob& job, const Tensor& t, const Sequence& s, std::int64_t h,
                             std::int64_t i0, std::int64_t nq, std::int64_t qcols, std::uint32_t* dims2,
                             std::uint32_t* queries2, std::uint16_t* rows) {
  const std::int64_t D = job.p.head_dim, dpad = dpad_of(D);
  std::uint16_t* lo = rows;
  std::uint16_t* hi = rows + dpad;
  std::fill(rows, rows + 2 * dpad, std::uint16_t{0});
  for (std::int64_t i = 0; i < qcols; i += 2) {
    for (std::int64_t r = 0; r < 2; ++r) {
      std::uint16_t* row = r == 0 ? lo : hi;
      if (i + r < nq) {
        copy_bf16_row(t, s.tb, h, s.q0 + i0 + i + r, D, row);
      } else {
        std::fill(row, row + D, std::uint16_t{0});
      }
    }
    // pairs of queries: lo in the low halves, hi in the high
    for (std::int64_t d = 0; d < dpad; d += 16) {
      const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + d)));
      const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + d)));
      _mm512_storeu_si512(queries2 + i / 2 * dpad + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
    // pairs of dims, one query a column
    for (std::int64_t p = 0; p < D / 2; ++p) {
      std::memcpy(dims2 + p * kBlockQ + i, lo + 2 * p, 4);
      std::memcpy(dims2 + p * kBlockQ + i + 1, hi + 2 * p, 4);
    }
  }
}

// Rows j < n of an FP32 block (row length kBlockQ) rounded to bf16 rows of
// the same length, 32 columns at a time (qcols a multiple of 32).
inline void round_rows_bf16(const float* src, std::int64_t n, std::int64_t qcols, std::uint16_t* dst) {
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t c = 0; c < qcols; c += 32) {
      const __m512 lo = _mm512_loadu_ps(src + j * kBlockQ + c);
      const __m512 hi = _mm512_loadu_ps(src + j * kBlockQ + c + 16);
      _mm512_storeu_si512(dst + j * kBlockQ + c, bits_of(_mm512_cvtne2ps_pbh(hi, lo)));
    }
}

// The FP32 products' S^T carries the scale in Q^T; here Q stays as stored
// (rounding it scaled would round it twice), so the scale goes on S^T.
inline void scale_block(float scale, std::int64_t n, std::int64_t qcols, float* st) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t c = 0; c < qcols; c += 16)
      _mm512_storeu_ps(st + j * kBlockQ + c, _mm512_mul_ps(_mm512_loadu_ps(st + j * kBlockQ + c), sc));
}

// ---- The work item -----------------------------------------------------------

// key_block_fp32's item (flash_backward_kernels.h) on bf16 products.
inline void key_block_bf16(const BackwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t kb, float* scratch) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  const BwdBf16Layout L = bwd_bf16_layout_for(p.head_dim);
  const std::int64_t D = p.head_dim, dpad = dpad_of(D);
  const std::int64_t block_k = L.f.block_k;
  if (kb * block_k >= s.kv_seq) return;
  const KeySpan keys = key_span(s, kb, block_k);
  // AMX: dQ^T's depth (the keys) in whole tiles of 16 pairs, zero past the
  // item's keys in K^T and dS^T's pairs (the other products' padding rows
  // only give rows of S^T, dP^T, dV and dK that are never read).
  const bool amx = amx_path(p);
  const std::int64_t n = keys.n, key_pairs = amx ? round_up(n, 32) / 2 : (n + 1) / 2;
  float* dk = scratch + L.f.dk;
  float* dv = scratch + L.f.dv;
  std::fill(dk, dk + n * dpad, 0.0f);
  std::fill(dv, dv + n * dpad, 0.0f);
  if (keys.i_begin < keys.i_end) pack_keys(job, s, hk, keys, 2 * key_pairs, L, scratch);

  const auto* k2 = reinterpret_cast<const std::uint16_t*>(scratch + L.k2);
  const auto* v2 = reinterpret_cast<const std::uint16_t*>(scratch + L.v2);
  const auto* kt2 = reinterpret_cast<const std::uint16_t*>(scratch + L.kt2);
  auto* qt2 = reinterpret_cast<std::uint32_t*>(scratch + L.qt2);
  auto* dot2 = reinterpret_cast<std::uint32_t*>(scratch + L.dot2);
  auto* qp = reinterpret_cast<std::uint32_t*>(scratch + L.qp);
  auto* dop = reinterpret_cast<std::uint32_t*>(scratch + L.dop);
  auto* pb = reinterpret_cast<std::uint16_t*>(scratch + L.pb);
  auto* dsb = reinterpret_cast<std::uint16_t*>(scratch + L.dsb);
  auto* dsp = reinterpret_cast<std::uint32_t*>(scratch + L.dsp);
  auto* rows = reinterpret_cast<std::uint16_t*>(scratch + L.rows);
  float* pt = scratch + L.f.pt;
  float* dst = scratch + L.f.dst;
  float* dqt = scratch + L.f.dqt;
#if ATTNPROF_FLASH_AMX
  if (amx && keys.i_begin < keys.i_end) load_tile_config();
#endif
  for (std::int64_t qb = keys.i_begin / kBlockQ; keys.i_begin < keys.i_end && qb <= (keys.i_end - 1) / kBlockQ; ++qb) {
    const std::int64_t i0 = qb * kBlockQ;
    const std::int64_t nq = std::min(kBlockQ, s.seq - i0);
    const std::int64_t qcols = round_up(nq, 32);  // the rounding to bf16 takes 32 columns at a time
    for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      pack_row_stats(job, s, h, i0, nq, qcols, scratch);
      pack_query_pairs(job, job.in.q, s, h, i0, nq, qcols, qt2, qp, rows);
      pack_query_pairs(job, job.dout, s, h, i0, nq, qcols, dot2, dop, rows);
      bf16_product<false>(amx, k2, D, qt2, kBlockQ, n, qcols, D / 2, pt, kBlockQ);  // S^T = K Q^T
      scale_block(job.q_scale, n, qcols, pt);
      mask_scores(job, s, h, i0, nq, qcols, keys, pt);
      bf16_product<false>(amx, v2, D, dot2, kBlockQ, n, qcols, D / 2, dst, kBlockQ);  // dP^T = V dO^T
      softmax_grads(job, n, qcols, scratch);
      round_rows_bf16(pt, n, qcols, pb);
      round_rows_bf16(dst, n, qcols, dsb);
      pack_p_pairs(dst, n, key_pairs, qcols, dsp);
      bf16_product<true>(amx, pb, kBlockQ, dop, dpad, n, dpad, qcols / 2, dv, dpad);            // dV += P^T dO
      bf16_product<true>(amx, dsb, kBlockQ, qp, dpad, n, dpad, qcols / 2, dk, dpad);            // dK += dS^T Q
      bf16_product<false>(amx, kt2, block_k, dsp, kBlockQ, D, qcols, key_pairs, dqt, kBlockQ);  // dQ^T = K^T dS^T
      add_dq(job, s, qb, h, dqt);
    }
  }
#if ATTNPROF_FLASH_AMX
  if (amx && keys.i_begin < keys.i_end) _tile_release();
#endif
  store_key_grads(job, s, hk, keys, dk, dv);
}

inline const char* backward_products_bf16(const Problem& p) {
  if (amx_path(p))
    return "bf16 AMX tile products (TDPBF16PS) for all five products, FP32 accumulation and softmax, P and dS "
           "rounded to bf16 for dV, dK and dQ";
  return "bf16 dot products (VDPBF16PS) on 16 lanes for all five products, FP32 accumulation and softmax, P and dS "
         "rounded to bf16 for dV, dK and dQ";
}

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
