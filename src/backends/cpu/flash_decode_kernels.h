// The CPU flash forward's decode item (flash_tiles.h's decodes(): a few
// queries a sequence), written once over flash_simd.h's vectors and compiled
// per instruction-set level inside ATTNPROF_ISA_NS, as the tiled items are.
//
// One item is a (sequence, KV head, key range: flash_tiles.h's
// decode_chunk_keys, merged by merge_decode): the rows of its query heads
// (the whole grouped-query group, each head's few queries) go together,
// R = group x queries rows, so every key and value row is read, and widened,
// once for all of them. The tiled items would take those rows one query head at a
// time, pad them to a vector's lanes (S^T's columns) and, in bf16, repack the
// head's K and V first: a decode step on the Xeon spent 100 ms where reading
// K and V takes a few (docs/perf/cpu-flash.md).
//
// Per key block: S^T[j][r] = q_r . k_j, each a dot product over the head dim
// (vectors along d, then the lanes summed: R is too few rows to fill a
// vector across), then the soft cap, the band, and the tiled items' own
// online softmax and P V over S^T's R columns (flash_microkernels.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "backends/cpu/flash_forward_kernels.h"

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

// Per-thread scratch, in floats: the scaled query rows and O ([rows][dpad]),
// a key block of K and V rows ([kBlockK][dpad]), S^T ([kBlockK][kDecodeRows])
// and the rows' m, l and alpha.
struct DecodeLayout {
  std::int64_t q = 0, k = 0, v = 0, s = 0, o = 0, m = 0, l = 0, alpha = 0, total = 0;
};

inline DecodeLayout decode_layout_for(std::int64_t head_dim) {
  const std::int64_t dpad = dpad_of(head_dim);
  DecodeLayout L;
  ScratchLayout scratch;
  const auto take = [&scratch](std::int64_t floats) { return scratch.take(floats); };
  take(kScratchHeaderFloats);
  L.q = take(kDecodeRows * dpad);
  L.k = take(kBlockK * dpad);
  L.v = take(kBlockK * dpad);
  L.s = take(kBlockK * kDecodeRows);
  L.o = take(kDecodeRows * dpad);
  L.m = take(kDecodeRows);
  L.l = take(kDecodeRows);
  L.alpha = take(kDecodeRows);
  L.total = scratch.total;
  return L;
}

// S^T[j][r] = q_r . k_j for n key rows (ldk floats apart) and R query rows
// (dpad floats apart, zero past the head dim as the key rows are), four rows
// a pass so each key vector loaded serves four FMAs.
inline void decode_dots(const float* q, std::int64_t rows, std::int64_t dpad, const float* k, std::int64_t ldk,
                        std::int64_t n, float* st, std::int64_t lds) {
  for (std::int64_t j = 0; j < n; ++j) {
    const float* kj = k + j * ldk;
    float* sj = st + j * lds;
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      Vf a0 = zeros(), a1 = zeros(), a2 = zeros(), a3 = zeros();
      for (std::int64_t d = 0; d < dpad; d += kLanes) {
        const Vf kv = load(kj + d);
        a0 = fma(load(q + r * dpad + d), kv, a0);
        a1 = fma(load(q + (r + 1) * dpad + d), kv, a1);
        a2 = fma(load(q + (r + 2) * dpad + d), kv, a2);
        a3 = fma(load(q + (r + 3) * dpad + d), kv, a3);
      }
      sj[r] = hsum(a0);
      sj[r + 1] = hsum(a1);
      sj[r + 2] = hsum(a2);
      sj[r + 3] = hsum(a3);
    }
    for (; r < rows; ++r) {
      Vf a = zeros();
      for (std::int64_t d = 0; d < dpad; d += kLanes) a = fma(load(q + r * dpad + d), load(kj + d), a);
      sj[r] = hsum(a);
    }
  }
}

// -inf where the band hides key j0 + j from row r's query (r % nq: rows are
// each head's nq queries in turn), on a block that straddles a bound.
inline void decode_mask_band(const Band& band, std::int64_t nq, std::int64_t rows, std::int64_t j0, std::int64_t n,
                             float* st, std::int64_t lds) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % nq;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t key = j0 + j;
      if (!geometry::visible(band, i, key)) st[j * lds + r] = kNegInf;
    }
  }
}

// Key rows [j0, j0 + n) of K or V (its pages when paged) widened into rows
// dpad floats apart, zero past the head dim: one run of n D elements where
// the rows lie end to end (a row at a time cost more than its arithmetic).
inline void decode_rows(const ForwardJob& job, const Tensor& logical, const Tensor& pages, const Sequence& s,
                        std::int64_t hk, std::int64_t j0, std::int64_t n, float* dst) {
  const std::int64_t D = job.p.head_dim, dpad = dpad_of(D);
  if (job.p.kv_cache != KvCache::Paged && D == dpad && logical.stride(3) == 1 && logical.stride(2) == D) {
    widen_row(logical, s.tb, hk, s.k0 + j0, n * D, dst);
    return;
  }
  for (std::int64_t j = 0; j < n; ++j) {
    float* row = dst + j * dpad;
    load_kv_row(job, logical, pages, s, hk, j0 + j, row);
    std::fill(row + D, row + dpad, 0.0f);
  }
}

// One decode item: every query row of KV head hk's query heads in sequence
// b, over the sequence's key range `chunk` (flash_tiles.h's
// decode_chunk_keys; flash.cpp hands out one item per (sequence, KV head,
// range)). With `partial`, the rows' unnormalised O, running max and sum go
// there (decode_partial_floats' layout) for merge_decode; else the rows are
// stored.
inline void attend_decode(const ForwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t chunk, float* scratch,
                          float* partial) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  const DecodeLayout L = decode_layout_for(p.head_dim);
  const std::int64_t D = p.head_dim, dpad = dpad_of(D), g = p.group(), nq = s.seq;
  const std::int64_t rows = g * nq, lds = round_up(rows, kLanes);
  float* q = scratch + L.q;
  float* st = scratch + L.s;
  float* o = scratch + L.o;
  float* m = scratch + L.m;
  float* l = scratch + L.l;
  float* alpha = scratch + L.alpha;
  std::fill(o, o + rows * dpad, 0.0f);
  std::fill(m, m + lds, kNegInf);
  std::fill(l, l + lds, 0.0f);

  const auto range = decode_chunk_keys(s, chunk);
  const KeyRange keys{.begin = range.begin, .end = range.end};
  if (keys.begin < keys.end) {
    // Row r = head hh's query i (r = hh nq + i), scaled, zero past the head dim.
    for (std::int64_t hh = 0; hh < g; ++hh)
      for (std::int64_t i = 0; i < nq; ++i) {
        float* row = q + (hh * nq + i) * dpad;
        widen_row(job.in.q, s.tb, hk * g + hh, s.q0 + i, D, row);
        for (std::int64_t d = 0; d < D; ++d) row[d] *= job.q_scale;
        std::fill(row + D, row + dpad, 0.0f);
      }
  }
  // Key rows [j0, j0 + n) of K or V and their stride: where they lie (FP32
  // unit-stride rows that are whole vectors), else widened into buf.
  const auto block_of = [&](const Tensor& t, const Tensor& pages, bool unit, float* buf, std::int64_t j0,
                            std::int64_t n) -> std::pair<const float*, std::int64_t> {
    if (unit && t.dtype() == DType::F32 && D == dpad)
      return {t.data_as<const float>() + t.index(s.tb, hk, s.k0 + j0, 0), t.stride(2)};
    decode_rows(job, t, pages, s, hk, j0, n, buf);
    return {buf, dpad};
  };
  for (std::int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const std::int64_t n = std::min(kBlockK, keys.end - j0);
    const auto [k_rows, ldk] = block_of(job.in.k, job.in.k_pages, job.k_unit, scratch + L.k, j0, n);
    decode_dots(q, rows, dpad, k_rows, ldk, n, st, lds);
    for (std::int64_t j = 0; j < n; ++j) std::fill(st + j * lds + rows, st + (j + 1) * lds, 0.0f);
    if (job.cap2 > 0) soft_cap(job.cap2, n, lds, st, lds);
    if (straddles_band(s.band, 0, nq, j0, n)) decode_mask_band(s.band, nq, rows, j0, n, st, lds);
    online_softmax(st, lds, n, lds, m, l, alpha);

    const auto [v_rows, ldv] = block_of(job.in.v, job.in.v_pages, job.v_unit, scratch + L.v, j0, n);
    pv_block(st, lds, v_rows, ldv, n, rows, dpad, alpha, o, dpad);
  }
  if (partial != nullptr) {
    for (std::int64_t r = 0; r < rows; ++r) std::copy(o + r * dpad, o + r * dpad + D, partial + r * D);
    std::copy(m, m + rows, partial + rows * D);
    std::copy(l, l + rows, partial + rows * D + rows);
    return;
  }
  for (std::int64_t hh = 0; hh < g; ++hh)
    store_rows(job, s, hk * g + hh, 0, nq, o + hh * nq * dpad, dpad, 1, m + hh * nq, l + hh * nq);
}

// Merges the `chunks` partial results of (sequence b, KV head hk), each
// `stride` floats from the last, in key order, and stores the rows: with M
// the largest running max, O = sum_c 2^(m_c - M) O_c and l = sum_c 2^(m_c - M)
// l_c, the shift M (a range that a row sees no key of has m -inf and weighs
// 0; no key at all gives l = 0, a zero row). The order is fixed, so the bits
// are the same on any thread count.
inline void merge_decode(const ForwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t chunks,
                         const float* partials, std::int64_t stride, float* scratch) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  const DecodeLayout L = decode_layout_for(p.head_dim);
  const std::int64_t D = p.head_dim, g = p.group(), nq = s.seq, rows = g * nq;
  float* o = scratch + L.o;  // rows of D floats here
  float* m = scratch + L.m;
  float* l = scratch + L.l;
  for (std::int64_t r = 0; r < rows; ++r) {
    float top = kNegInf;
    for (std::int64_t c = 0; c < chunks; ++c) top = std::max(top, partials[c * stride + rows * D + r]);
    const float shift = std::isfinite(top) ? top : 0.0f;
    float* row = o + r * D;
    std::fill(row, row + D, 0.0f);
    float sum = 0.0f;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const float* part = partials + c * stride;
      const float w = std::exp2(part[rows * D + r] - shift);  // a NaN max or sum reaches the row, as it would whole
      sum += w * part[rows * D + rows + r];
      for (std::int64_t d = 0; d < D; ++d) row[d] += w * part[r * D + d];
    }
    m[r] = top;
    l[r] = sum;
  }
  for (std::int64_t hh = 0; hh < g; ++hh)
    store_rows(job, s, hk * g + hh, 0, nq, o + hh * nq * D, D, 1, m + hh * nq, l + hh * nq);
}

inline std::int64_t decode_scratch_floats(const Problem& p) { return decode_layout_for(p.head_dim).total; }

// What decoding runs, for the story (a static sentence per level; 512 is
// kDecodeChunkKeys, which the static_assert holds it to).
static_assert(kDecodeChunkKeys == 512, "decode_products names the key ranges' length");
inline const char* decode_products() {
#if ATTNPROF_FLASH_AVX512
  return "decode: each KV head's keys and values read once for all its query heads' rows, FP32 dot products on 16 "
         "lanes (AVX-512), a long sequence's keys in ranges of 512 merged in key order";
#elif ATTNPROF_FLASH_AVX2
  return "decode: each KV head's keys and values read once for all its query heads' rows, FP32 dot products on 8 "
         "lanes (AVX2), a long sequence's keys in ranges of 512 merged in key order";
#else
  return "decode: each KV head's keys and values read once for all its query heads' rows, FP32 dot products on "
         "8-float arrays (baseline x86-64, SSE2), a long sequence's keys in ranges of 512 merged in key order";
#endif
}

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
