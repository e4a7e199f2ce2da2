// The CPU flash forward on bf16 products, for bf16 inputs: AVX512-BF16's
// VDPBF16PS (bf16 pairs multiplied and summed into FP32 lanes) and, where
// the level has AMX and head_dim is a multiple of 32, AMX-BF16 tile products
// (TDPBF16PS) for S^T = K Q^T and O^T = V^T P^T. Compiled in the avx512bf16
// and amx translation units only (flash_isa_table.h, ATTNPROF_ISA_BF16).
//
// Operands stay bf16, as the inputs are: no widening before the products.
// The softmax is FP32 (flash_microkernels.h's online_softmax on S^T); P is
// rounded to bf16 for P V, as the GPU kernels do. Layouts:
//  - Q^T in pairs, qt2[p][i] = (Q[i][2p], Q[i][2p+1]) (the low 16 bits the
//    even element), packed once per query block, unscaled (the scale is
//    applied to the FP32 scores, so Q is not rounded twice);
//  - K, bf16 rows [keys][D], and V, in pairs of keys (VNNI order) for
//    VDPBF16PS or transposed, V^T [D][keys], for AMX: repacked once per
//    (sequence, kv head) per thread into the thread's scratch, tagged in its
//    header, so every query block of the head (and of its grouped-query
//    group) reads them packed;
//  - P^T in pairs of keys, pp[t][i] = (P^T[2t][i], P^T[2t+1][i]).
// The AMX tile configuration, block product and epilogue are flash_amx_tiles.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/flash_forward_kernels.h"

#if !defined(ATTNPROF_FLASH_EMULATE)
#include <immintrin.h>
#if !defined(__AVX512BF16__)
#error "flash_bf16_kernels.h needs -mavx512bf16"
#endif
#endif
// ATTNPROF_FLASH_EMULATE_AMX: the tests' stand-ins (tests/cpu/avx512_emulation.h).
#if (defined(__AMX_TILE__) && defined(__AMX_BF16__)) || defined(ATTNPROF_FLASH_EMULATE_AMX)
#define ATTNPROF_FLASH_AMX 1
#endif

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

inline __m512bh as_bh(__m512i v) {
  __m512bh r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

inline __m512i bits_of(__m512bh h) {
  __m512i r;
  std::memcpy(&r, &h, sizeof r);
  return r;
}

// Sixteen FP32 lanes of a and b rounded to bf16 (to nearest even) and
// paired, a in the low half of each 32-bit lane: one VCVTNE2PS2BF16 (a's 16
// values in the low 16 words, b's in the high) and one word permute that
// interleaves them (word 2i from a_i, word 2i + 1 from b_i).
inline __m512i pair_bf16(__m512 a, __m512 b) {
  alignas(64) static constexpr std::uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                                21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                                11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_loadu_si512(kInterleave);
  return _mm512_permutexvar_epi16(idx, bits_of(_mm512_cvtne2ps_pbh(b, a)));
}

// The bf16 path takes bf16 inputs with an even head_dim (pairs) on
// VDPBF16PS; at the amx level only those whose head_dim is a multiple of 32,
// on tiles. There the others take the FP32 products on widened inputs: on the
// Xeon with AMX that was measured (docs/perf/cpu-flash.md, 2026-12-04) the
// VDPBF16PS kernels took 1.5x the FP32 kernels' time, forward (846 against
// 552 ms at head_dim 128) and backward (45.0 against 29.2 ms). e4m3 inputs
// take it as bf16 ones do: every e4m3 value is a bf16 value (e4m3_bits), so
// the products multiply the stored values exactly and the descales are the
// job's scales (ForwardJob::q_scale, o_scale).
inline bool bf16_inputs(const Problem& p) { return p.dtype == DType::BF16 || p.dtype == DType::F8E4M3; }
#if ATTNPROF_FLASH_AMX
inline bool amx_path(const Problem& p) { return bf16_inputs(p) && p.head_dim % 32 == 0; }
inline bool bf16_path(const Problem& p) { return amx_path(p); }
#else
inline bool amx_path(const Problem&) { return false; }
inline bool bf16_path(const Problem& p) { return bf16_inputs(p) && p.head_dim % 2 == 0; }
#endif

// Row `row` of t[b, h] as bf16 bits: a bf16 row where it lies (its elements
// `inc` apart), an e4m3 row converted into `staging` (n values, 1 apart).
struct Bf16Row {
  const std::uint16_t* at;
  std::int64_t inc;
};
inline Bf16Row bf16_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t n,
                        std::uint16_t* staging) {
  const std::int64_t first = t.index(b, h, row, 0);
  if (t.dtype() != DType::F8E4M3) return {t.data_as<const std::uint16_t>() + first, t.stride(3)};
  e4m3_row(t.data_as<const std::uint8_t>() + first, t.stride(3), n, staging);
  return {staging, 1};
}

// Keys the per-head caches hold room for: the longest sequence's, rounded up
// to pairs of tiles, plus one tile pair of zeros that a block starting at an
// odd key may read past the last one.
inline std::int64_t cache_keys(const Problem& p) { return round_up(p.kv_seq, 32) + 32; }

struct Bf16Layout {
  std::int64_t kc = 0, vc = 0, qt2 = 0, s = 0, pp = 0, o = 0, m = 0, l = 0, alpha = 0, total = 0;
};

// In floats; the bf16 regions take half a float per element.
inline Bf16Layout bf16_layout_for(const Problem& p) {
  const std::int64_t D = p.head_dim, dpad = dpad_of(D), keys = cache_keys(p);
  Bf16Layout L;
  ScratchLayout scratch;
  const auto take = [&scratch](std::int64_t floats) { return scratch.take(floats); };
  take(kScratchHeaderFloats);
  L.kc = take(keys * D / 2);
  L.vc = take(keys * dpad / 2);  // V pairs [keys / 2][dpad] or V^T [D][keys], uint16 each
  L.qt2 = take(D / 2 * kBlockQ);
  L.s = take(kBf16BlockK * kBlockQ);
  L.pp = take(kBf16BlockK / 2 * kBlockQ);
  L.o = take(kBlockQ * dpad);  // O [kBlockQ][dpad], or O^T [D][kBlockQ] for AMX
  L.m = take(kBlockQ);
  L.l = take(kBlockQ);
  L.alpha = take(kBlockQ);
  L.total = scratch.total;
  return L;
}

inline std::int64_t forward_scratch_bf16(const Problem& p) { return bf16_layout_for(p).total; }

// K and V of (sequence b, kv head hk) repacked into the thread's caches,
// unless they already hold them (the header's tag).
inline void fill_caches(const ForwardJob& job, std::int64_t b, std::int64_t hk, float* scratch, const Bf16Layout& L) {
  std::int64_t tag[2];
  std::memcpy(tag, scratch, sizeof tag);
  if (tag[0] == b && tag[1] == hk) return;
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  const std::int64_t D = p.head_dim, dpad = dpad_of(D), keys = cache_keys(p);
  const bool amx = amx_path(p);
  auto* kc = reinterpret_cast<std::uint16_t*>(scratch + L.kc);
  auto* vc = reinterpret_cast<std::uint16_t*>(scratch + L.vc);
  std::fill(kc + s.kv_seq * D, kc + keys * D, std::uint16_t{0});
  if (amx) {
    for (std::int64_t d = 0; d < D; ++d) std::fill(vc + d * keys + s.kv_seq, vc + (d + 1) * keys, std::uint16_t{0});
  } else {
    std::fill(vc + s.kv_seq / 2 * 2 * dpad, vc + keys * dpad, std::uint16_t{0});
  }
  // The inputs' bf16 values are copied as they are (e4m3 rows converted
  // first), 16 keys at a time, so that V^T's writes are 16 adjacent keys per
  // dim (a key's V row scattered over D rows of V^T, one value each, cost
  // 4-9 ns a value on the Xeon: docs/perf/cpu-flash.md).
  constexpr std::int64_t kChunk = 16;
  constexpr std::int64_t kMaxDim = 256;                   // the largest head dim a Problem takes
  alignas(64) std::uint16_t staged[kChunk + 1][kMaxDim];  // e4m3 rows as bf16: 16 of V, then one of K
  for (std::int64_t j0 = 0; j0 < s.kv_seq; j0 += kChunk) {
    const std::int64_t nj = std::min(kChunk, s.kv_seq - j0);
    Bf16Row v_rows[kChunk];
    for (std::int64_t jj = 0; jj < nj; ++jj) {
      const KvRow kr = kv_row(job, job.in.k, job.in.k_pages, s, j0 + jj);
      const Bf16Row k_src = bf16_row(kr.t, kr.b, hk, kr.row, D, staged[kChunk]);
      std::uint16_t* k_dst = kc + (j0 + jj) * D;
      if (k_src.inc == 1) {
        std::copy(k_src.at, k_src.at + D, k_dst);
      } else {
        for (std::int64_t d = 0; d < D; ++d) k_dst[d] = k_src.at[d * k_src.inc];
      }
      const KvRow vr = kv_row(job, job.in.v, job.in.v_pages, s, j0 + jj);
      v_rows[jj] = bf16_row(vr.t, vr.b, hk, vr.row, D, staged[jj]);
    }
    if (amx) {
      for (std::int64_t d = 0; d < D; ++d)  // V^T
        for (std::int64_t jj = 0; jj < nj; ++jj) vc[d * keys + j0 + jj] = v_rows[jj].at[d * v_rows[jj].inc];
    } else {
      for (std::int64_t jj = 0; jj < nj; ++jj) {  // pairs; those past D (dpad > D) stay zero
        const std::int64_t j = j0 + jj;
        for (std::int64_t d = 0; d < D; ++d) vc[(j / 2 * dpad + d) * 2 + j % 2] = v_rows[jj].at[d * v_rows[jj].inc];
        if (D < dpad && j % 2 == 0)
          std::fill(vc + (j / 2 * dpad + D) * 2, vc + (j / 2 + 1) * dpad * 2, std::uint16_t{0});
      }
    }
  }
  tag[0] = b;
  tag[1] = hk;
  std::memcpy(scratch, tag, sizeof tag);
}

// Query rows i0..i0+nq as pairs, qt2[p][i]; zero columns up to qcols. Q's
// bf16 values (bf16_path; e4m3 rows converted first) are paired as they are,
// not widened and rounded back.
inline void pack_q_pairs(const ForwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                         std::int64_t qcols, std::uint32_t* qt2) {
  const std::int64_t D = job.p.head_dim;
  alignas(64) std::uint16_t staged[256];  // an e4m3 row as bf16 (head dims up to 256)
  for (std::int64_t i = 0; i < nq; ++i) {
    const Bf16Row src = bf16_row(job.in.q, s.tb, h, s.q0 + i0 + i, D, staged);
    for (std::int64_t p = 0; p < D / 2; ++p)
      qt2[p * kBlockQ + i] = src.at[2 * p * src.inc] | (std::uint32_t{src.at[(2 * p + 1) * src.inc]} << 16);
  }
  for (std::int64_t p = 0; p < D / 2; ++p) std::fill(qt2 + p * kBlockQ + nq, qt2 + p * kBlockQ + qcols, 0u);
}

// P^T rows j < n paired into pp[t][i] for t < pairs (rows past n are zero).
inline void pack_p_pairs(const float* st, std::int64_t n, std::int64_t pairs, std::int64_t qcols, std::uint32_t* pp) {
  const __m512 zero = _mm512_setzero_ps();
  for (std::int64_t t = 0; t < pairs; ++t) {
    const std::int64_t j = 2 * t;
    for (std::int64_t c = 0; c < qcols; c += 16) {
      const __m512 a = j < n ? _mm512_loadu_ps(st + j * kBlockQ + c) : zero;
      const __m512 b = j + 1 < n ? _mm512_loadu_ps(st + (j + 1) * kBlockQ + c) : zero;
      _mm512_storeu_si512(pp + t * kBlockQ + c, pair_bf16(a, b));
    }
  }
}

// online_softmax's sink for P V's operand: P^T rows paired as they are made,
// pp[t][i] = (P^T[2t][i], P^T[2t+1][i]), an odd last row with a zero.
struct PPairs {
  std::uint32_t* pp;
  void operator()(std::int64_t j, std::int64_t c, Vf p0, Vf p1) const {
    _mm512_storeu_si512(pp + j / 2 * kBlockQ + c, pair_bf16(p0.v, p1.v));
  }
  void tail(std::int64_t j, std::int64_t c, Vf p0) const {
    _mm512_storeu_si512(pp + j / 2 * kBlockQ + c, pair_bf16(p0.v, _mm512_setzero_ps()));
  }
};

// ---- VDPBF16PS: S^T = K Qt and O += P V, register tiles as the FP32 ones ----

// st[r][0..32) = scale * sum_p K[r] pair p . qt2[p][0..32) for r < MR.
template <int MR>
inline void qk_tile_bf16(const std::uint16_t* k, std::int64_t ldk, const std::uint32_t* qt2, std::int64_t pairs,
                         float scale, float* st) {
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < pairs; ++p) {
    const __m512bh q0 = as_bh(_mm512_loadu_si512(qt2 + p * kBlockQ));
    const __m512bh q1 = as_bh(_mm512_loadu_si512(qt2 + p * kBlockQ + 16));
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      std::int32_t pair;
      std::memcpy(&pair, k + r * ldk + 2 * p, sizeof pair);
      const __m512bh kr = as_bh(_mm512_set1_epi32(pair));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], kr, q0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], kr, q1);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(st + r * kBlockQ, _mm512_mul_ps(acc[r][0], sc));
    _mm512_storeu_ps(st + r * kBlockQ + 16, _mm512_mul_ps(acc[r][1], sc));
  }
}

inline void qk_block_bf16(const std::uint16_t* k, std::int64_t ldk, std::int64_t n, const std::uint32_t* qt2,
                          std::int64_t qcols, std::int64_t pairs, float scale, float* st) {
  std::int64_t j = 0;
  for (; j + kBf16TileRows <= n; j += kBf16TileRows)
    for (std::int64_t c = 0; c < qcols; c += 32)
      qk_tile_bf16<kBf16TileRows>(k + j * ldk, ldk, qt2 + c, pairs, scale, st + j * kBlockQ + c);
  if (j == n) return;
  with_tail_rows<kBf16TileRows - 1>(n - j, [&](auto mr) {
    for (std::int64_t c = 0; c < qcols; c += 32)
      qk_tile_bf16<decltype(mr)::value>(k + j * ldk, ldk, qt2 + c, pairs, scale, st + j * kBlockQ + c);
  });
}

// o[r][0..16 NV) = alpha[r] o[r] + sum_t pp[t][r] . vp[t][0..16 NV) for r < MR.
template <int MR, int NV>
inline void pv_tile_bf16(const std::uint32_t* pp, const std::uint32_t* vp, std::int64_t ldv, std::int64_t pairs,
                         const float* alpha, float* o, std::int64_t ldo) {
  __m512 acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(o + r * ldo + 16 * c));
  }
  for (std::int64_t t = 0; t < pairs; ++t) {
    __m512bh vt[NV];
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) vt[c] = as_bh(_mm512_loadu_si512(vp + t * ldv + 16 * c));
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512bh pr = as_bh(_mm512_set1_epi32(static_cast<std::int32_t>(pp[t * kBlockQ + r])));
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pr, vt[c]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * ldo + 16 * c, acc[r][c]);
}

template <int NV>
inline void pv_strip_bf16(const std::uint32_t* pp, const std::uint32_t* vp, std::int64_t ldv, std::int64_t pairs,
                          std::int64_t rows, const float* alpha, float* o, std::int64_t ldo) {
  std::int64_t i = 0;
  for (; i + kBf16TileRows <= rows; i += kBf16TileRows)
    pv_tile_bf16<kBf16TileRows, NV>(pp + i, vp, ldv, pairs, alpha + i, o + i * ldo, ldo);
  if (i == rows) return;
  with_tail_rows<kBf16TileRows - 1>(rows - i, [&](auto mr) {
    pv_tile_bf16<decltype(mr)::value, NV>(pp + i, vp, ldv, pairs, alpha + i, o + i * ldo, ldo);
  });
}

inline void pv_block_bf16(const std::uint32_t* pp, const std::uint32_t* vp, std::int64_t ldv, std::int64_t pairs,
                          std::int64_t rows, std::int64_t dpad, const float* alpha, float* o, std::int64_t ldo) {
  std::int64_t c = 0;
  for (; c + 32 <= dpad; c += 32) pv_strip_bf16<2>(pp, vp + c, ldv, pairs, rows, alpha, o + c, ldo);
  if (c < dpad) pv_strip_bf16<1>(pp, vp + c, ldv, pairs, rows, alpha, o + c, ldo);
}

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS

#include "backends/cpu/flash_amx_tiles.h"

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

// One work item on bf16 products (see the top of this file).
inline void attend_block_bf16(const ForwardJob& job, std::int64_t b, std::int64_t h, std::int64_t i0, float* scratch) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  if (i0 >= s.seq) return;
  const Bf16Layout L = bf16_layout_for(p);
  const std::int64_t D = p.head_dim, dpad = dpad_of(D);
  [[maybe_unused]] const std::int64_t keys_cached = cache_keys(p);
  const std::int64_t hk = h / p.group();
  const std::int64_t nq = std::min(kBlockQ, s.seq - i0);
  const std::int64_t qcols = round_up(nq, 32);
  const bool amx = amx_path(p);
  auto* qt2 = reinterpret_cast<std::uint32_t*>(scratch + L.qt2);
  auto* pp = reinterpret_cast<std::uint32_t*>(scratch + L.pp);
  const auto* kc = reinterpret_cast<const std::uint16_t*>(scratch + L.kc);
  const auto* vc = reinterpret_cast<const std::uint16_t*>(scratch + L.vc);
  float* st = scratch + L.s;
  float* o = scratch + L.o;
  float* m = scratch + L.m;
  float* l = scratch + L.l;
  float* alpha = scratch + L.alpha;

  std::fill(o, o + kBlockQ * dpad, 0.0f);
  std::fill(m, m + kBlockQ, kNegInf);
  std::fill(l, l + kBlockQ, 0.0f);

  // The scores' scale rides in the softmax's exponent (no pass over S^T)
  // unless a soft cap or a bias must see them scaled first, or the scale is
  // negative (legal; the max of the scaled scores is then their min's).
  const bool fold_scale = job.q_scale > 0 && job.cap2 <= 0 && p.mask != MaskKind::Bias;
  KeyRange keys = visible_keys(s, i0, nq);
  keys.begin &= ~std::int64_t{1};  // blocks start on a pair of keys (the extra key is masked as outside the band)
  if (keys.begin < keys.end) {
    fill_caches(job, b, hk, scratch, L);
    pack_q_pairs(job, s, h, i0, nq, qcols, qt2);
  }
#if ATTNPROF_FLASH_AMX
  if (amx && keys.begin < keys.end) load_tile_config();
#endif
  for (std::int64_t j0 = keys.begin; j0 < keys.end; j0 += kBf16BlockK) {
    const std::int64_t n = std::min(kBf16BlockK, keys.end - j0);
    const std::uint16_t* k_rows = kc + j0 * D;
    if (amx) {
#if ATTNPROF_FLASH_AMX
      // S^T tiles: A = 16 K rows by 32 dims, B = 16 pairs of Qt by 16 queries.
      amx_gemm<false>(k_rows, D, qt2, kBlockQ, round_up(n, 16), qcols, D / 2, st, kBlockQ);
      if (!fold_scale) {
        const __m512 sc = _mm512_set1_ps(job.q_scale);
        for (std::int64_t j = 0; j < n; ++j)
          for (std::int64_t c = 0; c < qcols; c += 16)
            _mm512_storeu_ps(st + j * kBlockQ + c, _mm512_mul_ps(_mm512_loadu_ps(st + j * kBlockQ + c), sc));
      }
#endif
    } else {
      qk_block_bf16(k_rows, D, n, qt2, qcols, D / 2, fold_scale ? 1.0f : job.q_scale, st);
    }
    mask_block(job, s, h, i0, nq, qcols, j0, n, st, kBlockQ);
    // P^T's pairs straight from the softmax: the AMX product reads pairs
    // up to a multiple of 32 keys, zero past n.
    const std::int64_t pairs = amx ? round_up(n, 32) / 2 : (n + 1) / 2;
    online_softmax<true>(st, kBlockQ, n, qcols, m, l, alpha, fold_scale ? job.q_scale : 1.0f, PPairs{pp});
    for (std::int64_t t = (n + 1) / 2; t < pairs; ++t) std::fill(pp + t * kBlockQ, pp + t * kBlockQ + qcols, 0u);

    if (amx) {
#if ATTNPROF_FLASH_AMX
      // O^T = diag(alpha) O^T + V^T P^T: A = 16 rows of V^T by 32 keys, B = 16 key pairs of P^T by 16 queries.
      // O^T's columns rescaled where their row's max moved (alpha < 1); on
      // long rows the max settles after a few blocks and most strips skip.
      for (std::int64_t c = 0; c < qcols; c += 16) {
        const __m512 a = _mm512_loadu_ps(alpha + c);
        if (_mm512_cmp_ps_mask(a, _mm512_set1_ps(1.0f), _CMP_EQ_OQ) == 0xffff) continue;
        for (std::int64_t d = 0; d < D; ++d)
          _mm512_storeu_ps(o + d * kBlockQ + c, _mm512_mul_ps(_mm512_loadu_ps(o + d * kBlockQ + c), a));
      }
      amx_gemm<true>(vc + j0, keys_cached, pp, kBlockQ, D, qcols, pairs, o, kBlockQ);
#endif
    } else {
      const auto* vp = reinterpret_cast<const std::uint32_t*>(vc) + j0 / 2 * dpad;
      pv_block_bf16(pp, vp, dpad, pairs, nq, dpad, alpha, o, dpad);
    }
  }
#if ATTNPROF_FLASH_AMX
  if (amx && keys.begin < keys.end) _tile_release();
#endif
  if (amx) {
    store_rows_amx(job, s, h, i0, nq, o, m, l);
  } else {
    store_rows(job, s, h, i0, nq, o, dpad, 1, m, l);
  }
}

inline const char* forward_products_bf16(const Problem& p) {
  if (p.dtype == DType::F8E4M3) {
    if (amx_path(p))
      return "e4m3 inputs as bf16 (exact), bf16 AMX tile products (TDPBF16PS) for Q K^T and P V, FP32 softmax, P "
             "rounded to bf16 for P V";
    return "e4m3 inputs as bf16 (exact), bf16 dot products (VDPBF16PS) on 16 lanes for Q K^T and P V, FP32 softmax, "
           "P rounded to bf16 for P V";
  }
  if (amx_path(p))
    return "bf16 AMX tile products (TDPBF16PS) for Q K^T and P V, FP32 softmax, P rounded to bf16 for P V";
  return "bf16 dot products (VDPBF16PS) on 16 lanes for Q K^T and P V, FP32 softmax, P rounded to bf16 for P V";
}

// The bf16 ceiling's product (flash_kernels.h's Kernels::bf16_gemm): AMX tiles
// where the level has them, else VDPBF16PS register tiles. m, n and k
// multiples of 32.
inline void bf16_gemm(const std::uint16_t* a, const std::uint32_t* b, float* c, std::int64_t m, std::int64_t n,
                      std::int64_t k) {
#if ATTNPROF_FLASH_AMX
  load_tile_config();
  amx_gemm<false>(a, k, b, n, m, n, k / 2, c, n);
  _tile_release();
#else
  for (std::int64_t j = 0; j < n; j += 32)
    for (std::int64_t i = 0; i < m; i += 8) {
      __m512 acc[8][2];
      for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
      for (std::int64_t p = 0; p < k / 2; ++p) {
        const __m512bh b0 = as_bh(_mm512_loadu_si512(b + p * n + j));
        const __m512bh b1 = as_bh(_mm512_loadu_si512(b + p * n + j + 16));
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
          std::int32_t pair;
          std::memcpy(&pair, a + (i + r) * k + 2 * p, sizeof pair);
          const __m512bh ar = as_bh(_mm512_set1_epi32(pair));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
        }
      }
      for (int r = 0; r < 8; ++r) {
        _mm512_storeu_ps(c + (i + r) * n + j, acc[r][0]);
        _mm512_storeu_ps(c + (i + r) * n + j + 16, acc[r][1]);
      }
    }
#endif
}

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
