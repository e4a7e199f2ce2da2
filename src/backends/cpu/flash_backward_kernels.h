// The CPU flash backward's work item (see flash_backward.cpp for the
// algorithm and the driver), written once over flash_simd.h's vectors and
// compiled per instruction-set level inside ATTNPROF_ISA_NS
// (src/backends/cpu/isa/). FP32 products at every level; bf16 inputs at the
// avx512bf16 and amx levels take flash_backward_bf16_kernels.h's products,
// which share this file's tiles, softmax step, masking and dQ add.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>

#include "backends/cpu/flash_forward_kernels.h"

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

// Keys per item: 128 while the item's K, K^T and V rows and its dK and dV
// accumulators (5 x 128 x D floats, 320 KiB at D = 128) fit the 512 KiB L2
// next to the query block's tiles; 64 beyond (D = 256 would need 640 KiB).
// More keys per item means fewer passes over each query block's packing and
// its dQ tile's locked add.
inline std::int64_t key_block_rows(std::int64_t head_dim) { return head_dim <= 128 ? 128 : 64; }

// C[r][0..kLanes NV) (+)= sum_k A[r][k] B[k][0..kLanes NV) for r < MR: A broadcast, B
// loaded as vectors, all row-major.
template <int MR, int NV, bool kAccumulate>
inline void gemm_tile(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t depth, float* c,
                      std::int64_t ldc) {
  Vf acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? load(c + r * ldc + kLanes * v) : zeros();
  for (std::int64_t k = 0; k < depth; ++k) {
    Vf bk[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bk[v] = load(b + k * ldb + kLanes * v);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const Vf ar = broadcast(a + r * lda + k);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(ar, bk[v], acc[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) store(c + r * ldc + kLanes * v, acc[r][v]);
}

template <int NV, bool kAccumulate>
inline void gemm_strip(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t rows,
                       std::int64_t depth, float* c, std::int64_t ldc) {
  std::int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows)
    gemm_tile<kTileRows, NV, kAccumulate>(a + r * lda, lda, b, ldb, depth, c + r * ldc, ldc);
  a += r * lda;
  c += r * ldc;
  if (r == rows) return;
  with_tail_rows(rows - r,
                 [&](auto mr) { gemm_tile<decltype(mr)::value, NV, kAccumulate>(a, lda, b, ldb, depth, c, ldc); });
}

// C[rows x cols] (+)= A[rows x depth] B[depth x cols], cols a multiple of kLanes.
// Column strips outermost: one strip of B (depth x 2 kLanes floats, 4-8 KiB
// for a depth of 64) stays in L1 while every row tile streams A.
template <bool kAccumulate>
inline void gemm(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t rows,
                 std::int64_t cols, std::int64_t depth, float* c, std::int64_t ldc) {
  std::int64_t col = 0;
  for (; col + 2 * kLanes <= cols; col += 2 * kLanes)
    gemm_strip<2, kAccumulate>(a, lda, b + col, ldb, rows, depth, c + col, ldc);
  if (col < cols) gemm_strip<1, kAccumulate>(a, lda, b + col, ldb, rows, depth, c + col, ldc);
}

// Per-thread tiles, in floats; every region starts on a 64-byte boundary.
struct BwdLayout {
  std::int64_t block_k = 0;  // keys per item (key_block_rows)
  std::int64_t k = 0, kt = 0, v = 0, q = 0, qt = 0, dout = 0, doutt = 0, pt = 0, dst = 0, dk = 0, dv = 0, dqt = 0,
               lse2 = 0, delta = 0, total = 0;
};

inline BwdLayout bwd_layout_for(std::int64_t head_dim) {
  const std::int64_t D = head_dim, dpad = dpad_of(head_dim);
  BwdLayout L;
  L.block_k = key_block_rows(head_dim);
  const std::int64_t keys = L.block_k;
  ScratchLayout scratch;
  const auto take = [&scratch](std::int64_t floats) { return scratch.take(floats); };
  L.k = take(keys * D);
  L.kt = take(D * keys);
  L.v = take(keys * D);
  L.q = take(kBlockQ * dpad);
  L.qt = take(D * kBlockQ);
  L.dout = take(kBlockQ * dpad);
  L.doutt = take(D * kBlockQ);
  L.pt = take(keys * kBlockQ);
  L.dst = take(keys * kBlockQ);
  L.dk = take(keys * dpad);
  L.dv = take(keys * dpad);
  L.dqt = take(D * kBlockQ);
  L.lse2 = take(kBlockQ);
  L.delta = take(kBlockQ);
  L.total = scratch.total;
  return L;
}

inline std::int64_t blocks(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

// Query rows i0..i0+nq of head h, per row: the LSE in base 2, +inf on a
// fully masked row and on padding up to qcols so that P = 2^(S - LSE) is 0
// there; D = rowsum(dO * O), 0 on padding.
inline void pack_row_stats(const BackwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                           std::int64_t qcols, float* scratch) {
  const BwdLayout L = bwd_layout_for(job.p.head_dim);
  const std::int64_t row0 = (s.tb * job.p.heads + h) * job.lse_rows + s.q0 + i0;
  float* lse2 = scratch + L.lse2;
  float* delta = scratch + L.delta;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < qcols; ++i) {
    const float lse = i < nq ? job.lse[row0 + i] : kNegInf;
    lse2[i] = lse == kNegInf ? kInf : lse * kLog2e;
    delta[i] = i < nq ? job.delta[row0 + i] : 0.0f;
  }
}

// Query rows i0..i0+nq of head h: Q and dO row-major (zero past D) and
// transposed (zero past nq up to qcols), Q^T pre-scaled; and the rows' stats.
inline void pack_queries(const BackwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                         std::int64_t qcols, float* scratch) {
  const BwdLayout L = bwd_layout_for(job.p.head_dim);
  const std::int64_t D = job.p.head_dim;
  float* q = scratch + L.q;
  float* qt = scratch + L.qt;
  float* d_o = scratch + L.dout;
  float* d_ot = scratch + L.doutt;
  for (std::int64_t i = 0; i < nq; ++i) {
    float* qi = q + i * dpad_of(D);
    float* di = d_o + i * dpad_of(D);
    widen_row(job.in.q, s.tb, h, s.q0 + i0 + i, D, qi);
    widen_row(job.dout, s.tb, h, s.q0 + i0 + i, D, di);
    std::fill(qi + D, qi + dpad_of(D), 0.0f);
    std::fill(di + D, di + dpad_of(D), 0.0f);
    for (std::int64_t d = 0; d < D; ++d) {
      qt[d * kBlockQ + i] = qi[d] * job.q_scale;
      d_ot[d * kBlockQ + i] = di[d];
    }
  }
  for (std::int64_t d = 0; d < D; ++d) {
    std::fill(qt + d * kBlockQ + nq, qt + d * kBlockQ + qcols, 0.0f);
    std::fill(d_ot + d * kBlockQ + nq, d_ot + d * kBlockQ + qcols, 0.0f);
  }
  pack_row_stats(job, s, h, i0, nq, qcols, scratch);
}

// S^T (base-2 logits, masked) turned into P^T = 2^(S^T - LSE) in place, and
// dP^T into the scaled dS^T = scale P^T (dP^T - D), in place. With a soft cap
// (kCap) S^T holds the capped logits cap2 tanh(.), and dS^T also takes the
// cap's derivative 1 - t^2, t = S^T / cap2 recovered from them; a masked
// -inf gives -inf there, clamped to 0 (its P is 0 and 0 x -inf is NaN).
template <bool kCap>
inline void probabilities_and_ds(const BackwardJob& job, std::int64_t n, std::int64_t qcols, float* scratch) {
  const BwdLayout L = bwd_layout_for(job.p.head_dim);
  const float* lse2 = scratch + L.lse2;
  const float* delta = scratch + L.delta;
  float* pt = scratch + L.pt;
  float* dst = scratch + L.dst;
  const Vf scale = splat(job.scale);
  const Vf inv_cap = splat(kCap ? 1.0f / job.cap2 : 0.0f);
  const Vf one = splat(1.0f);
  for (std::int64_t c = 0; c < qcols; c += kLanes) {
    const Vf shift = load(lse2 + c);
    const Vf dc = load(delta + c);
    for (std::int64_t j = 0; j < n; ++j) {
      float* pj = pt + j * kBlockQ + c;
      float* sj = dst + j * kBlockQ + c;
      const Vf s = load(pj);
      const Vf prob = exp2(sub(s, shift));
      store(pj, prob);
      Vf ds = mul(mul(prob, sub(load(sj), dc)), scale);
      if constexpr (kCap) {
        const Vf t = mul(s, inv_cap);
        ds = mul(ds, max(zeros(), sub(one, mul(t, t))));
      }
      store(sj, ds);
    }
  }
}
// The step between the two pairs of products, capped or not (one branch a block).
inline void softmax_grads(const BackwardJob& job, std::int64_t n, std::int64_t qcols, float* scratch) {
  if (job.cap2 > 0) {
    probabilities_and_ds<true>(job, n, qcols, scratch);
  } else {
    probabilities_and_ds<false>(job, n, qcols, scratch);
  }
}

// The keys of one work item: j0..j0+n of its sequence, and the queries that
// can see any of them, [i_begin, i_end) (a key none sees keeps zero gradients).
struct KeySpan {
  std::int64_t j0 = 0, n = 0, i_begin = 0, i_end = 0;
};

inline KeySpan key_span(const Sequence& s, std::int64_t kb, std::int64_t block_k) {
  KeySpan k;
  k.j0 = kb * block_k;
  k.n = std::min(block_k, s.kv_seq - k.j0);
  const auto rows = geometry::rows_of_keys(s.band, k.j0, k.j0 + k.n, s.seq);
  k.i_begin = rows.begin;
  k.i_end = rows.end;
  return k;
}

// S^T of query rows i0..i0+nq (head h) against the span's keys, scaled:
// soft-capped, then masked by the band where the block straddles a bound
// and by a mask or bias tensor.
inline void mask_scores(const BackwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                        std::int64_t qcols, const KeySpan& keys, float* st) {
  const Problem& p = job.p;
  const Band& band = s.band;
  const std::int64_t j0 = keys.j0, n = keys.n;
  if (job.cap2 > 0) soft_cap(job.cap2, n, qcols, st, kBlockQ);
  if (straddles_band(band, i0, nq, j0, n)) mask_band(band, i0, j0, n, qcols, st, kBlockQ);
  if (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias)
    mask_tensor(p, job.in, s.tb, h, s.q0 + i0, nq, s.k0 + j0, n, st, kBlockQ);
}

// The item's dQ^T contribution for (query block qb, head h) added to the
// shared FP32 tile under its lock (flash_backward.cpp says why).
inline void add_dq(const BackwardJob& job, const Sequence& s, std::int64_t qb, std::int64_t h, const float* dqt) {
  const std::int64_t D = job.p.head_dim;
  const std::int64_t tile = (s.qb0 + qb) * job.p.heads + h;
  float* acc = job.dq_acc + tile * D * kBlockQ;
  const std::lock_guard<std::mutex> hold(job.dq_locks[static_cast<std::size_t>(tile)]);
  for (std::int64_t x = 0; x < D * kBlockQ; x += kLanes) store(acc + x, add(load(acc + x), load(dqt + x)));
}

// dK and dV of the span's keys (rows dpad floats apart), rounded once.
inline void store_key_grads(const BackwardJob& job, const Sequence& s, std::int64_t hk, const KeySpan& keys,
                            const float* dk, const float* dv) {
  const std::int64_t D = job.p.head_dim, dpad = dpad_of(D);
  for (std::int64_t j = 0; j < keys.n; ++j) {
    store_row(job.grads.dk, s.tb, hk, s.k0 + keys.j0 + j, D, dk + j * dpad);
    store_row(job.grads.dv, s.tb, hk, s.k0 + keys.j0 + j, D, dv + j * dpad);
  }
}

// One (sequence, kv head, key block): dK and dV of keys j0..j0+n, and the
// contributions of those keys to dQ; nothing past a short sequence's keys.
inline void key_block_fp32(const BackwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t kb, float* scratch) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  const BwdLayout L = bwd_layout_for(job.p.head_dim);
  const std::int64_t D = p.head_dim, dpad = dpad_of(D);
  const std::int64_t block_k = L.block_k;
  if (kb * block_k >= s.kv_seq) return;
  const KeySpan keys = key_span(s, kb, block_k);
  const std::int64_t n = keys.n;
  float* k = scratch + L.k;
  float* kt = scratch + L.kt;
  float* v = scratch + L.v;
  float* dk = scratch + L.dk;
  float* dv = scratch + L.dv;
  std::fill(dk, dk + n * dpad, 0.0f);
  std::fill(dv, dv + n * dpad, 0.0f);

  if (keys.i_begin < keys.i_end) {
    for (std::int64_t j = 0; j < n; ++j) {
      widen_row(job.in.k, s.tb, hk, s.k0 + keys.j0 + j, D, k + j * D);
      widen_row(job.in.v, s.tb, hk, s.k0 + keys.j0 + j, D, v + j * D);
      for (std::int64_t d = 0; d < D; ++d) kt[d * block_k + j] = k[j * D + d];
    }
  }
  float* pt = scratch + L.pt;
  float* dst = scratch + L.dst;
  float* dqt = scratch + L.dqt;
  for (std::int64_t qb = keys.i_begin / kBlockQ; keys.i_begin < keys.i_end && qb <= (keys.i_end - 1) / kBlockQ; ++qb) {
    const std::int64_t i0 = qb * kBlockQ;
    const std::int64_t nq = std::min(kBlockQ, s.seq - i0);
    const std::int64_t qcols = round_up(nq, 16);
    for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      pack_queries(job, s, h, i0, nq, qcols, scratch);
      gemm<false>(k, D, scratch + L.qt, kBlockQ, n, qcols, D, pt, kBlockQ);  // S^T = K Q^T
      mask_scores(job, s, h, i0, nq, qcols, keys, pt);
      gemm<false>(v, D, scratch + L.doutt, kBlockQ, n, qcols, D, dst, kBlockQ);  // dP^T = V dO^T
      softmax_grads(job, n, qcols, scratch);
      gemm<true>(pt, kBlockQ, scratch + L.dout, dpad, n, dpad, nq, dv, dpad);  // dV += P^T dO
      gemm<true>(dst, kBlockQ, scratch + L.q, dpad, n, dpad, nq, dk, dpad);    // dK += dS^T Q
      gemm<false>(kt, block_k, dst, kBlockQ, D, qcols, n, dqt, kBlockQ);       // dQ^T part = K^T dS^T
      add_dq(job, s, qb, h, dqt);
    }
  }
  store_key_grads(job, s, hk, keys, dk, dv);
}

inline std::int64_t backward_scratch_floats(std::int64_t head_dim) { return bwd_layout_for(head_dim).total; }

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
