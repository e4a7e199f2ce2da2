// The CPU flash forward's work item (see flash.cpp for the algorithm and the
// driver), written once over flash_simd.h's vectors and compiled per
// instruction-set level inside ATTNPROF_ISA_NS (src/backends/cpu/isa/).
// Everything here computes in FP32: 16-bit rows are widened as they are read.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>

#include "backends/cpu/flash_kernels.h"
#include "backends/cpu/flash_microkernels.h"

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

// 64 keys a block: S^T (64 keys by up to 128 query columns, 32 KiB) stays in
// L1 beside the operands while the products write it and the softmax reads it.
constexpr std::int64_t kBlockK = 64;
// The bf16 kernels' key blocks: 128 keys, half the tile products' O
// (O^T on AMX) loads and stores a key of 64 (AMX 1k 0.92, head dim 128 0.98
// of 64's time).
constexpr std::int64_t kBf16BlockK = 128;

// Query rows a work item: 128 where a head's K and V in FP32 take more than
// 2 MiB (past 4096 keys at head dim 64, 2048 at 128), more than a core's L2
// (2 MiB on the Xeons measured) keeps, so every item reads them from L3:
// twice the rows an item halve that traffic (8k keys causal: 3% faster).
// kBlockQ (64) up to there, where the smaller item's shorter diagonal wins
// (4096 keys at 64: 1% slower with 128; docs/perf/cpu-flash.md).
//
// Per sequence, from its own keys: under a window an item's key blocks start
// at its first row's first key, so the rows an item takes set where a row's
// blocks fall, hence its bits; a sequence must give the same bits in a packed
// batch (whose longest sequence sets the driver's item rows) or as a caller's
// rows as alone (VarlenBackends.PackedWindowCallIsPerSequenceDenseCallsBitForBit).
inline std::int64_t rows_for_keys(std::int64_t kv_seq, std::int64_t head_dim) {
  return kv_seq * head_dim * 2 * 4 > (std::int64_t{2} << 20) ? 2 * kBlockQ : kBlockQ;
}
// The driver's item rows: the most any sequence of p takes.
inline std::int64_t forward_rows_fp32(const Problem& p) { return rows_for_keys(p.kv_seq, p.head_dim); }

inline std::int64_t dpad_of(std::int64_t head_dim) { return round_up(head_dim, kLanes); }

// Per-thread scratch, in floats; every region starts on a 64-byte boundary.
struct Layout {
  std::int64_t qt = 0, k = 0, v = 0, s = 0, o = 0, m = 0, l = 0, alpha = 0, colmax = 0, total = 0;
};

inline Layout layout_for(std::int64_t head_dim, std::int64_t rows) {
  const std::int64_t dpad = dpad_of(head_dim);
  Layout L;
  ScratchLayout scratch;
  const auto take = [&scratch](std::int64_t floats) { return scratch.take(floats); };
  take(kScratchHeaderFloats);
  L.qt = take(head_dim * rows);
  L.k = take(kBlockK * head_dim);
  L.v = take(kBlockK * dpad);
  L.s = take(kBlockK * rows);
  L.o = take(rows * dpad);
  L.m = take(rows);
  L.l = take(rows);
  L.alpha = take(rows);
  L.colmax = take(rows);
  L.total = scratch.total;
  return L;
}

// An e4m3 byte as FP32 bits, branch-free (selects by masks, which GCC
// if-converts where a ternary stays a branch) so that a loop over a row
// vectorizes with the level's flags: a normal's bits moved into place with the
// exponent rebiased by 120, a subnormal m x 2^-9, the NaNs NaN. Every value is
// exact and a bf16 (its low 16 bits are zero). A byte at a time through
// e4m3_to_float's branches made the FP8 forward 35% slower than bf16's.
inline std::uint32_t e4m3_bits(std::uint32_t b) {
  const std::uint32_t mag = b & 0x7fu;
  const std::uint32_t normal = (mag << 20) + (120u << 23);
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(mag)) * 0x1p-9f);
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(mag < 8);
  const std::uint32_t is_nan = 0u - static_cast<std::uint32_t>(mag == 0x7f);
  const std::uint32_t f = (sub & is_sub) | (normal & ~is_sub);
  return (0x7fc00000u & is_nan) | (f & ~is_nan) | ((b & 0x80u) << 24);
}

// n e4m3 values, `inc` apart, as FP32 or as bf16 bits.
inline void e4m3_row(const std::uint8_t* src, std::int64_t inc, std::int64_t n, float* dst) {
  if (inc == 1) {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = std::bit_cast<float>(e4m3_bits(src[c]));
  } else {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = std::bit_cast<float>(e4m3_bits(src[c * inc]));
  }
}
inline void e4m3_row(const std::uint8_t* src, std::int64_t inc, std::int64_t n, std::uint16_t* dst) {
  if (inc == 1) {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = static_cast<std::uint16_t>(e4m3_bits(src[c]) >> 16);
  } else {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = static_cast<std::uint16_t>(e4m3_bits(src[c * inc]) >> 16);
  }
}

// Row i of t[b, h] (n elements) widened to FP32; vector loads when unit-stride.
inline void widen_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n, float* dst) {
  const std::int64_t base = t.index(b, h, i, 0);
  const std::int64_t inc = t.stride(3);
  const void* data = t.data();
  if (t.dtype() == DType::F8E4M3) {  // e4m3 as it is stored (the descales are the job's scales)
    e4m3_row(static_cast<const std::uint8_t*>(data) + base, inc, n, dst);
    return;
  }
  if (inc != 1 && n > 1) {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = load_as_float(data, t.dtype(), base + c * inc);
    return;
  }
  std::int64_t c = 0;
  switch (t.dtype()) {
    case DType::F32:
      std::memcpy(dst, static_cast<const float*>(data) + base, static_cast<std::size_t>(n) * 4);
      return;
    case DType::F16: {
      const auto* src = static_cast<const std::uint16_t*>(data) + base;
      for (; c + kLanes <= n; c += kLanes) store(dst + c, load_f16(src + c));
      break;
    }
    case DType::BF16: {
      const auto* src = static_cast<const std::uint16_t*>(data) + base;
      for (; c + kLanes <= n; c += kLanes) store(dst + c, load_bf16(src + c));
      break;
    }
    case DType::Bool:
    case DType::I32:
    case DType::F8E4M3:  // above
      break;
  }
  for (; c < n; ++c) dst[c] = load_as_float(data, t.dtype(), base + c);
}

// Soft-capping on a block of S^T (n key rows by qcols query columns, rows lds
// floats apart), applied after the scale and before the mask: with the
// logits base 2, s2 = log2(e) s, the cap c becomes cap2 = log2(e) c and
// s2 <- cap2 tanh(s2 / cap2). qcols is a multiple of kLanes. Callers branch
// on cap2 > 0 once per block, so an uncapped run never comes here.
inline void soft_cap(float cap2, std::int64_t n, std::int64_t qcols, float* st, std::int64_t lds) {
  const Vf cap = splat(cap2), inv = splat(1.0f / cap2);
  for (std::int64_t j = 0; j < n; ++j) {
    float* row = st + j * lds;
    for (std::int64_t c = 0; c < qcols; c += kLanes) store(row + c, mul(cap, tanh(mul(load(row + c), inv))));
  }
}

// Where key j's K or V row of sequence s lies: row s.k0 + j of batch s.tb
// in the logical tensor, or with a paged cache row r % page of page
// block_table[b][r / page], r = s.k0 + j (the pages are read where they lie,
// never gathered).
struct KvRow {
  const Tensor& t;
  std::int64_t b, row;
};
inline KvRow kv_row(const ForwardJob& job, const Tensor& logical, const Tensor& pages, const Sequence& s,
                    std::int64_t j) {
  if (job.p.kv_cache != KvCache::Paged) return {logical, s.tb, s.k0 + j};
  const Tensor& table = job.in.block_table;  // a paged cache is never packed: s.tb is the batch
  const std::int64_t page = job.p.page_size;
  const std::int64_t row = s.k0 + j;  // the sequence's keys start at its first row (kv_rows)
  const std::int64_t phys =
      table.data_as<const std::int32_t>()[s.tb * table.stride(2) + (row / page) * table.stride(3)];
  return {pages, phys, row % page};
}

// That row of kv head hk widened to FP32.
inline void load_kv_row(const ForwardJob& job, const Tensor& logical, const Tensor& pages, const Sequence& s,
                        std::int64_t hk, std::int64_t j, float* dst) {
  const KvRow r = kv_row(job, logical, pages, s, j);
  widen_row(r.t, r.b, hk, r.row, job.p.head_dim, dst);
}

// Query rows i0..i0+nq transposed into qt[d][i] (rows ldq floats apart) and
// pre-scaled; columns up to qcols are zero so padded lanes compute harmless values.
inline void pack_q(const ForwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                   std::int64_t qcols, float* qt, std::int64_t ldq, float* row) {
  const std::int64_t D = job.p.head_dim;
  for (std::int64_t i = 0; i < nq; ++i) {
    widen_row(job.in.q, s.tb, h, s.q0 + i0 + i, D, row);
    for (std::int64_t d = 0; d < D; ++d) qt[d * ldq + i] = row[d] * job.q_scale;
  }
  for (std::int64_t d = 0; d < D; ++d) std::fill(qt + d * ldq + nq, qt + d * ldq + qcols, 0.0f);
}

// The block's rows' log-sum-exp (natural log, -inf on a fully masked row,
// NaN on a row whose sum took a NaN), where the job saves it.
inline void store_lse(const ForwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                      const float* m, const float* l) {
  if (!job.lse) return;
  float* lse = job.lse + (s.tb * job.p.heads + h) * job.lse_rows + s.q0 + i0;
  for (std::int64_t i = 0; i < nq; ++i)
    lse[i] = l[i] != 0.0f ? std::log(l[i]) + m[i] * std::numbers::ln2_v<float> : kNegInf;
}

// out rows = O / l, zeros where l == 0 (every key masked: never NaN), NaN
// where l is NaN (a NaN score or input reached the row, as it reaches the
// float64 reference's: the test is l != 0, which NaN passes); and for
// a training forward each row's natural-log LSE, ln(l) + m ln 2 (m is the
// base-2 running max), -inf where l == 0. O is row i at o + i * ldo_row, or
// (transposed, the AMX kernel's O^T) column i at o + i with rows ldo_col apart.
inline void store_rows(const ForwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                       const float* o, std::int64_t ldo_row, std::int64_t ldo_col, const float* m, const float* l) {
  const Tensor& out = job.out;
  const std::int64_t D = job.p.head_dim;
  const std::int64_t inc = out.stride(3);
  store_lse(job, s, h, i0, nq, m, l);
  constexpr std::int64_t kMaxRow = 256;  // the largest head dim a Problem takes
  float row[kMaxRow];                    // a 16-bit row, normalised, before store_row rounds it
  for (std::int64_t i = 0; i < nq; ++i) {
    const float inv = l[i] != 0.0f ? job.o_scale / l[i] : 0.0f;
    const float* src = o + i * ldo_row;
    const std::int64_t base = out.index(s.tb, h, s.q0 + i0 + i, 0);
    if (out.dtype() == DType::F32 && inc == 1) {
      float* dst = out.data_as<float>() + base;
      for (std::int64_t d = 0; d < D; ++d) dst[d] = src[d * ldo_col] * inv;
    } else if (D <= kMaxRow) {
      for (std::int64_t d = 0; d < D; ++d) row[d] = src[d * ldo_col] * inv;
      store_row(out, s.tb, h, s.q0 + i0 + i, D, row);
    } else {
      for (std::int64_t d = 0; d < D; ++d)
        store_from_float(out.data(), out.dtype(), base + d * inc, src[d * ldo_col] * inv);
    }
  }
}

// The keys any row of query rows [i0, i0 + nq) can see, [begin, end).
struct KeyRange {
  std::int64_t begin = 0, end = 0;
};
inline KeyRange visible_keys(const Sequence& s, std::int64_t i0, std::int64_t nq) {
  const auto keys = geometry::keys_of_rows(s.band, i0, i0 + nq, s.kv_seq);
  return {.begin = keys.begin, .end = keys.end};
}

// The query columns [begin, end) of rows [i0, i0 + nq) that can see any key
// of [j0, j0 + n), begin rounded down and end up to whole S^T tiles (kQkCols;
// end at most qcols): the block's products, softmax and P V run on these
// alone, and the rows outside keep O, m and l as they are (their P is 0 and
// their alpha 1). Where an item has more rows than a key block, the
// diagonal's blocks are seen by only part of them.
struct ColRange {
  std::int64_t begin = 0, end = 0;
};
inline ColRange visible_cols(const Band& band, std::int64_t i0, std::int64_t nq, std::int64_t qcols, std::int64_t j0,
                             std::int64_t n) {
  const std::int64_t first = band.has_hi ? std::clamp(j0 - band.hi - i0, std::int64_t{0}, nq) : 0;
  const std::int64_t last = band.has_lo ? std::clamp(j0 + n - band.lo() - i0, first, nq) : nq;
  return {.begin = first / kQkCols * kQkCols, .end = std::min(qcols, round_up(last, kQkCols))};
}

// Whether the block of rows [i0, i0 + nq) and keys [j0, j0 + n) straddles a
// bound of the band.
inline bool straddles_band(const Band& band, std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t n) {
  return geometry::block_cut_by_band(band, i0, i0 + nq, j0, j0 + n);
}
inline bool has_mask_tensor(const ForwardJob& job) {
  return (job.p.mask == MaskKind::Boolean && !job.mask_lowered) || job.p.mask == MaskKind::Bias;
}

// Soft cap, band and tensor masks on one block of S^T (n keys from j0, rows
// lds floats apart).
inline void mask_block(const ForwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                       std::int64_t qcols, std::int64_t j0, std::int64_t n, float* st, std::int64_t lds) {
  if (job.cap2 > 0) soft_cap(job.cap2, n, qcols, st, lds);
  if (straddles_band(s.band, i0, nq, j0, n)) mask_band(s.band, i0, j0, n, qcols, st, lds);
  if (has_mask_tensor(job)) mask_tensor(job.p, job.in, s.tb, h, s.q0 + i0, nq, s.k0 + j0, n, st, lds);
}

// Sized for the larger item whatever the rows, so a run's workspace does not
// depend on its sequence length.
inline std::int64_t forward_scratch_fp32(const Problem& p) { return layout_for(p.head_dim, 2 * kBlockQ).total; }

// One work item in FP32: query rows [i0, i0 + kRows) of (sequence b, head h)
// against every visible key of the sequence; nothing past a short sequence's end.
template <std::int64_t kRows>
inline void attend_rows_fp32(const ForwardJob& job, std::int64_t b, std::int64_t h, std::int64_t i0, float* scratch) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  if (i0 >= s.seq) return;
  const Layout L = layout_for(p.head_dim, kRows);
  const std::int64_t D = p.head_dim;
  const std::int64_t dpad = dpad_of(D);
  const std::int64_t hk = h / p.group();
  const std::int64_t nq = std::min(kRows, s.seq - i0);
  const std::int64_t qcols = round_up(nq, kQkCols);
  float* qt = scratch + L.qt;
  float* st = scratch + L.s;
  float* o = scratch + L.o;
  float* m = scratch + L.m;
  float* l = scratch + L.l;
  float* alpha = scratch + L.alpha;
  // FP32 unit-stride K rows are read where they lie; V too when its rows are
  // whole vectors.
  const bool k_in_place = job.k_unit && job.in.k.dtype() == DType::F32;
  const bool v_in_place = job.v_unit && job.in.v.dtype() == DType::F32 && D % kLanes == 0;

  std::fill(o, o + nq * dpad, 0.0f);
  std::fill(m, m + kRows, kNegInf);
  std::fill(l, l + kRows, 0.0f);

  // The keys any row of this block can see; rows outside it stay all-masked.
  const KeyRange keys = visible_keys(s, i0, nq);
  if (keys.begin < keys.end) pack_q(job, s, h, i0, nq, qcols, qt, kRows, st);

  const Tensor& K = job.in.k;
  const Tensor& V = job.in.v;
  for (std::int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const std::int64_t n = std::min(kBlockK, keys.end - j0);
    const ColRange cols = visible_cols(s.band, i0, nq, qcols, j0, n);
    const std::int64_t c0 = cols.begin, ncols = cols.end - c0, nrows = std::min(nq, cols.end) - c0;
    if (ncols <= 0) continue;

    const float* k_rows = scratch + L.k;
    std::int64_t ldk = D;
    if (k_in_place) {
      k_rows = K.data_as<const float>() + K.index(s.tb, hk, s.k0 + j0, 0);
      ldk = K.stride(2);
    } else {
      for (std::int64_t j = 0; j < n; ++j) load_kv_row(job, K, job.in.k_pages, s, hk, j0 + j, scratch + L.k + j * D);
    }
    Prefetch v_next;
    if (v_in_place)
      v_next = {.rows = V.data_as<const float>() + V.index(s.tb, hk, s.k0 + j0, 0), .ld = V.stride(2), .floats = D};
    // A block no mask or cap touches takes its max from the products' registers.
    const bool masked = job.cap2 > 0 || straddles_band(s.band, i0 + c0, nrows, j0, n) || has_mask_tensor(job);
    float* colmax = masked ? nullptr : scratch + L.colmax;
    qk_block(k_rows, ldk, n, qt + c0, kRows, ncols, D, st + c0, kRows, v_next, colmax);
    if (masked) mask_block(job, s, h, i0 + c0, nrows, ncols, j0, n, st + c0, kRows);

    online_softmax(st + c0, kRows, n, ncols, m + c0, l + c0, alpha + c0, colmax);

    const float* v_rows = scratch + L.v;
    std::int64_t ldv = dpad;
    if (v_in_place) {
      v_rows = V.data_as<const float>() + V.index(s.tb, hk, s.k0 + j0, 0);
      ldv = V.stride(2);
    } else {
      for (std::int64_t j = 0; j < n; ++j) {
        float* row = scratch + L.v + j * dpad;
        load_kv_row(job, V, job.in.v_pages, s, hk, j0 + j, row);
        std::fill(row + D, row + dpad, 0.0f);
      }
    }
    pv_block(st + c0, kRows, v_rows, ldv, n, nrows, dpad, alpha + c0, o + c0 * dpad, dpad);
  }
  store_rows(job, s, h, i0, nq, o, dpad, 1, m, l);
}

// The driver's item of forward_rows_fp32(p) rows from i0, as the sequence's
// own items (rows_for_keys of its keys): one, or two of half the rows.
inline void attend_block_fp32(const ForwardJob& job, std::int64_t b, std::int64_t h, std::int64_t i0, float* scratch) {
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  if (rows_for_keys(s.kv_seq, job.p.head_dim) == 2 * kBlockQ) {
    attend_rows_fp32<2 * kBlockQ>(job, b, h, i0, scratch);
    return;
  }
  attend_rows_fp32<kBlockQ>(job, b, h, i0, scratch);
  if (forward_rows_fp32(job.p) == 2 * kBlockQ) attend_rows_fp32<kBlockQ>(job, b, h, i0 + kBlockQ, scratch);
}

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
