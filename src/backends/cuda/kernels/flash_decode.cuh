// Split-KV decode (FlashDecoding): few query rows against a long KV cache.
//
// A prefill kernel gives each CTA 128 query rows of one head; with one query
// a head that tile is almost all padding, and batch * heads CTAs read each
// KV head `group` times. Here instead:
//   - the query heads of a grouped-query group and their queries are packed
//     into one tile of rows (row r: query r / group, head kv_head * group +
//     r % group), so each CTA reads its KV head once for all of them: 16 rows
//     where they are few, 64 where a KV head has more (DecodeCfg's
//     kRowWarps);
//   - the keys are cut into num_splits ranges, one CTA each (grid x), so a
//     small batch still fills the GPU; each split writes its rows' O,
//     normalised, in FP32 with its log-sum-exp, and flash_decode_combine_kernel
//     merges the splits by their log-sum-exp. One split writes O directly;
//   - inside a 16-row CTA the 4 warps take 16 keys each of every 64-key
//     tile (the 16 rows are all they have), each with its own online
//     softmax; the four partial results merge once through shared memory at
//     the end. In a 64-row CTA each warp takes 16 rows and every key;
//   - K and V stream through kStages cp.async stages (the kernel is
//     memory-bound: what matters is bytes in flight), from a contiguous cache
//     or, kPaged, from pages found through the block table, row by row.
// Masks are runtime (a memory-bound kernel has the instructions to spare):
// none, causal (either alignment through diag_offset) and sliding window.
//
// Per-sequence key rows (a.kv_spans, a paged call's seq_lens) are read here,
// on the device, in the caller's stream order: the host never sees them. So
// that no entry can make the kernel read outside the cache or the table, a
// count is clamped to 0 .. seq_k (the table's capacity) and a table entry
// outside the cache's pages masks that page's keys (nothing of it is loaded);
// either sets a bit of the device's input-error word. The splits are planned
// on seq_k, the longest; each CTA cuts its own sequence's tiles, so a short
// sequence's later splits are empty (a zero partial at LSE -inf, which the
// combine weighs 0).
#pragma once

#include <cuda_runtime.h>

#include <bit>
#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/warp_gemm_sm80.cuh"

namespace attnprof::cuda::kernels {

struct DecodeArgs {
  FwdArgs a;       // q, k, v, o, strides, shape, scale, mask geometry, lse
  MaskMode mask;   // a runtime choice here
  int row_blocks;  // ceil(seq_q * group / rows)
  int rows;        // packed query rows a CTA: kFlashDecodeRows or kFlashDecodeWideRows (DecodeCfg)
  int num_splits;  // grid x
  // kPaged: a.k and a.v are pages [num_pages, Hkv, page_size, D]; a.k_batch_stride
  // (a.v_batch_stride) is the page stride. Sequence b's key j lives in page
  // block_table[b * pages_per_seq + (j >> page_shift)], row j & (page_size - 1).
  const std::int32_t* block_table;
  int pages_per_seq, page_shift;
  int num_pages;           // kPaged: entries outside [0, num_pages) mask their keys
  unsigned* input_errors;  // or null: where a clamped count or a bad page is reported
  // num_splits > 1: each split's normalised O, [num_splits][B * H * seq_q][D],
  // and log-sum-exp, [num_splits][B * H * seq_q] (-inf: the split saw no key).
  float* o_partial;
  float* lse_partial;
  // Or null: one counter a (sequence, KV head, row block) tile, zero at launch; the
  // split that counts last merges the tile's splits (merge_splits) and zeroes it
  // again, where a combine kernel would (DecodePlan::fused_combine).
  unsigned* tile_counters;

  // From the problem and its plan (fused_kernels.h). Without a workspace
  // the keys stay in one range: slower, not wrong.
  static DecodeArgs from(const FusedParams& p, int rows, int row_blocks, int splits) {
    if (p.workspace == nullptr) splits = 1;
    const std::size_t rows_all = static_cast<std::size_t>(p.batch) * p.heads * p.seq_q;
    return DecodeArgs{
        .a = FwdArgs::from(p),
        .mask = mask_mode(p.mask),
        .row_blocks = row_blocks,
        .rows = rows,
        .num_splits = splits,
        .block_table = p.block_table,
        .pages_per_seq = p.pages_per_seq,
        .page_shift = p.page_size > 0 ? std::countr_zero(static_cast<unsigned>(p.page_size)) : 0,
        .num_pages = p.num_pages,
        .input_errors = p.input_errors,
        .o_partial = p.workspace,
        .lse_partial = p.workspace != nullptr ? p.workspace + splits * rows_all * p.head_dim : nullptr,
        .tile_counters = nullptr,
    };
  }
};

// kRowWarps: the warps laid along the packed rows. 1 (kFlashDecodeRows rows a
// CTA): every warp takes the same 16 rows and 16 keys of each 64-key tile,
// the four merged at the end; the few rows of one query a head. 4
// (kFlashDecodeWideRows): each warp its own 16 rows and every key, the tile
// in shared memory read once for 64 rows; a KV head's many rows (several
// queries x its group) then read K and V once a CTA rather than once per 16.
template <int kHeadDim_, int kRowWarps_ = 1>
struct DecodeCfg {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRowWarps = kRowWarps_;
  static constexpr int kWarps = 4;
  static constexpr int kKeyWarps = kWarps / kRowWarps;  // warps sharing a row tile, each its keys
  static constexpr int kRows = 16 * kRowWarps;          // packed query rows per CTA
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockN = kFlashDecodeKeys;  // keys per tile (the host's split plan counts them)
  static constexpr int kKeysPerWarp = kBlockN / kKeyWarps;
  static constexpr int kKeyTiles = kKeysPerWarp / 8;  // n8 tiles of a warp's scores
  static_assert(kWarps % kRowWarps == 0 && kBlockN % (16 * kKeyWarps) == 0, "whole k16 steps a warp");
  static_assert(kRows == kFlashDecodeRows || kRows == kFlashDecodeWideRows, "the host plans these row tiles");
  // Enough bytes in flight to cover DRAM latency: 2 CTAs an SM at D <= 128
  // (the wide tile's Q is four times the bytes: two stages beside it).
  static constexpr int kStages = kHeadDim <= 64 ? 4 : kRowWarps == 1 ? 3 : 2;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kKSteps = kHeadDim / 16;
  using QTile = SmemTile<kRows, kHeadDim>;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kStageBytes = 2 * KVTile::kBytes;  // K then V
  // The merge of the warps' results reuses the stages: each warp's 16 rows
  // of kHeadDim FP32 (padded), then each warp's row max and row sum.
  static constexpr int kMergeStride = kHeadDim + 8;
  static constexpr int kMergeBytes = (kWarps * 16 * kMergeStride + 2 * kWarps * 16) * 4;
  static constexpr int kStagesBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes = QTile::kBytes + (kStagesBytes > kMergeBytes ? kStagesBytes : kMergeBytes);
};

// Sequence b's arguments: its key rows (FwdArgs::kv_spans: (begin, end)
// pairs, or ends alone) read on the device and clamped to 0 .. seq_k
// (reported when they had to be), its keys numbered from its first row, and
// its bottom-right diagonal. A contiguous cache's K and V are offset to that
// row; a paged cache's table is read at key0 + key.
template <bool kPaged>
__device__ __forceinline__ FwdArgs decode_sequence(const DecodeArgs& d, int b, bool report, int& key0) {
  FwdArgs a = d.a;
  key0 = 0;
  if (a.kv_spans == nullptr) return a;
  const auto keys = geometry::span_rows(a.kv_spans + a.kv_span_width * b, a.kv_span_width, a.seq_k);
  if (!keys.exact && report && d.input_errors != nullptr) atomicOr(d.input_errors, kInputBadKeyCount);
  a.seq_k = keys.rows.size();
  key0 = keys.rows.begin;
  if constexpr (!kPaged) {
    a.k += key0 * a.k_row_stride;
    a.v += key0 * a.v_row_stride;
  }
  if (a.bottom_right) a.diag_offset = geometry::bottom_right_offset(a.seq_q, a.seq_k);
  return a;
}

// Whether a block table entry names one of the cache's pages.
__device__ __forceinline__ bool page_in_cache(const DecodeArgs& d, std::int64_t page) {
  return page >= 0 && page < d.num_pages;
}

// Visible key interval (lo, hi) of query qi: lo < j < hi.
__device__ __forceinline__ void visible_keys(const FwdArgs& a, MaskMode mask, int qi, int& lo, int& hi) {
  hi = a.seq_k;
  lo = -1;
  if (mask != MaskMode::None) hi = min(hi, qi + a.diag_offset + 1);
  if (mask == MaskMode::Window) lo = qi + a.diag_offset - a.window;
}

template <int kHeadDim, Half16 Element>
__device__ void merge_splits(const DecodeArgs& d, std::int64_t row_id, int lane);

template <class Cfg, Half16 Element, bool kPaged>
__global__ void __launch_bounds__(Cfg::kThreads, 1) flash_decode_splitkv_kernel(const __grid_constant__ DecodeArgs d) {
  constexpr int kD = Cfg::kHeadDim, kBN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kChunksPerRow = kD / 8;
  using QTile = typename Cfg::QTile;
  using KVTile = typename Cfg::KVTile;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  std::uint16_t* const q_smem = reinterpret_cast<std::uint16_t*>(smem_raw);
  unsigned char* const stages = smem_raw + QTile::kBytes;
  auto k_smem = [&](int s) { return reinterpret_cast<std::uint16_t*>(stages + s * Cfg::kStageBytes); };
  auto v_smem = [&](int s) { return k_smem(s) + KVTile::kElems; };

  allow_dependents();  // the combine's blocks may come resident now: they wait for this grid (wait_prior_grid)
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int split = blockIdx.x, batch = blockIdx.z;
  // One CTA of the sequence reports a clamped count.
  int key0 = 0;  // the sequence's first key row (kv_rows' begin)
  const FwdArgs a = decode_sequence<kPaged>(d, batch, tid == 0 && blockIdx.x == 0 && blockIdx.y == 0, key0);
  const int kv_head = blockIdx.y / d.row_blocks;
  const int r0 = (blockIdx.y % d.row_blocks) * Cfg::kRows;
  const int rows_total = a.seq_q * a.group;
  const int r_last = min(rows_total, r0 + Cfg::kRows) - 1;

  // The CTA's key tiles: the union of its rows' visible keys, cut into num_splits.
  int lo_first, hi_last, lo_last, hi_first;
  visible_keys(a, d.mask, r0 / a.group, lo_first, hi_first);
  visible_keys(a, d.mask, r_last / a.group, lo_last, hi_last);
  // (A window may reach before key 0: the range starts at 0, never below.)
  const int key_begin = max(0, lo_first + 1), key_end = hi_last;
  int tile_begin = 0, tile_end = 0;
  if (key_end > key_begin) {
    const int first = key_begin / kBN, count = (key_end + kBN - 1) / kBN - first;
    const int per_split = (count + d.num_splits - 1) / d.num_splits;
    tile_begin = first + min(count, split * per_split);
    tile_end = first + min(count, (split + 1) * per_split);
  }

  // Q: the 16 packed rows (zeros past rows_total), one cp.async group with the first stage.
  for (int c = tid; c < Cfg::kRows * kChunksPerRow; c += Cfg::kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8, row = r0 + r;
    const bool valid = row < rows_total;
    const int qi = valid ? row / a.group : 0, head = kv_head * a.group + (valid ? row % a.group : 0);
    const std::uint16_t* src = a.q + batch * a.q_batch_stride + head * a.q_head_stride + qi * a.q_row_stride + col;
    cp_async_16(smem_u32(q_smem + QTile::offset(r, col)), src, valid);
  }

  // K and V rows of key tile t into stage s: each thread takes one column
  // chunk of rows tid / kChunksPerRow + i * kRowsPerPass.
  constexpr int kRowsPerPass = Cfg::kThreads / kChunksPerRow;
  static_assert(Cfg::kThreads % kChunksPerRow == 0 && kBN % kRowsPerPass == 0, "whole rows per pass");
  const int load_row = tid / kChunksPerRow, load_col = (tid % kChunksPerRow) * 8;
  const std::int64_t k_head = kv_head * a.k_head_stride + load_col, v_head = kv_head * a.v_head_stride + load_col;
  auto load_tile = [&](int t, int s) {
#pragma unroll
    for (int i = 0; i < kBN / kRowsPerPass; ++i) {
      const int r = load_row + i * kRowsPerPass, key = t * kBN + r;
      bool valid = key < a.seq_k;
      std::int64_t k_off = 0, v_off = 0;
      if (valid) {
        if constexpr (kPaged) {
          // key0 + key < the clamped end <= pages_per_seq x page_size: inside the table's row.
          const int row = key0 + key;
          const std::int64_t page = d.block_table[batch * d.pages_per_seq + (row >> d.page_shift)];
          const int in_page = row & ((1 << d.page_shift) - 1);
          if (page_in_cache(d, page)) {
            k_off = page * a.k_batch_stride + k_head + in_page * a.k_row_stride;
            v_off = page * a.v_batch_stride + v_head + in_page * a.v_row_stride;
          } else {
            valid = false;  // zeros, never read; its scores are masked below
            if (d.input_errors != nullptr) atomicOr(d.input_errors, kInputBadPage);
          }
        } else {
          k_off = batch * a.k_batch_stride + k_head + key * a.k_row_stride;
          v_off = batch * a.v_batch_stride + v_head + key * a.v_row_stride;
        }
      }
      cp_async_16(smem_u32(k_smem(s) + KVTile::offset(r, load_col)), a.k + k_off, valid);
      cp_async_16(smem_u32(v_smem(s) + KVTile::offset(r, load_col)), a.v + v_off, valid);
    }
  };

  // Prologue: kStages - 1 tiles in flight (empty groups past the end keep the count uniform).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (tile_begin + s < tile_end) load_tile(tile_begin + s, s);
    cp_async_commit();
  }

  // This warp's 16 rows and keys of each tile; this thread's two rows
  // (fragment rows g and g + 8) and what they see.
  const int row_warp = warp / Cfg::kKeyWarps, key_warp = warp % Cfg::kKeyWarps;
  const int g = lane / 4, warp_row0 = row_warp * 16;
  int row_lo[2], row_hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    visible_keys(a, d.mask, min(r0 + warp_row0 + g + 8 * h, r_last) / a.group, row_lo[h], row_hi[h]);
  }
  // Tiles wholly inside every row's interval need no per-element mask.
  const int clean_lo = lo_last + 1, clean_hi = hi_first;

  float acc[1][Cfg::kDTiles][4];
  zero(acc);
  OnlineSoftmax<1> softmax;
  softmax.init();
  const int warp_key0 = key_warp * Cfg::kKeysPerWarp;
  constexpr int kNT = Cfg::kKeyTiles;
  for (int t = tile_begin; t < tile_end; ++t) {
    const int i = t - tile_begin, stage = i % kStages;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile t landed for every thread; stage (i - 1) % kStages is free
    if (t + kStages - 1 < tile_end) load_tile(t + kStages - 1, (i + kStages - 1) % kStages);
    cp_async_commit();

    float s[1][kNT][4];
    gemm_qk_smem<Element, QTile, KVTile, 1, kNT, Cfg::kKSteps>(s, q_smem, warp_row0,
                                                               k_smem(stage) + KVTile::offset(warp_key0, 0), lane);
    const int n0 = t * kBN + warp_key0;
    // kPaged: the warp's keys whose page is not in the cache, a bit each
    // (lane l looks up key n0 + l, and n0 + 32 + l past 32 keys; the table
    // row is in L1 after the loads).
    std::uint64_t bad_keys = 0;
    if constexpr (kPaged) {
#pragma unroll
      for (int c = 0; c < (Cfg::kKeysPerWarp + 31) / 32; ++c) {
        const int col = c * 32 + lane, key = n0 + col;
        const bool bad = col < Cfg::kKeysPerWarp && key < a.seq_k &&
                         !page_in_cache(d, d.block_table[batch * d.pages_per_seq + ((key0 + key) >> d.page_shift)]);
        bad_keys |= static_cast<std::uint64_t>(__ballot_sync(0xffffffffu, bad)) << (32 * c);
      }
    }
    if (bad_keys != 0 || n0 < clean_lo || n0 + Cfg::kKeysPerWarp > clean_hi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = nt * 8 + 2 * (lane % 4) + e, key = n0 + col;
            if (key >= row_hi[h] || key <= row_lo[h] || ((bad_keys >> col) & 1u)) s[0][nt][2 * h + e] = -INFINITY;
          }
        }
      }
    }
    softmax.update<false>(s, acc, a.scale_log2);
    gemm_pv<Element, KVTile, 1, kNT, Cfg::kDTiles>(acc, s, v_smem(stage) + KVTile::offset(warp_key0, 0), lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: the merge may reuse them

  // Merge the key warps of each row tile: each warp writes its 16 rows'
  // unnormalised O, row max and row sum (slot warp * 16 + row).
  float* const merge = reinterpret_cast<float*>(stages);
  float* const merge_max = merge + Cfg::kWarps * 16 * Cfg::kMergeStride;
  float* const merge_sum = merge_max + Cfg::kWarps * 16;
  float inv_unused[1][2];
  softmax.finish(inv_unused);  // row_sum reduced over the quad
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    float* const o_row = merge + (warp * 16 + r) * Cfg::kMergeStride;
#pragma unroll
    for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
      *reinterpret_cast<float2*>(o_row + dt * 8 + 2 * (lane % 4)) =
          make_float2(acc[0][dt][2 * h], acc[0][dt][2 * h + 1]);
    }
    if (lane % 4 == 0) {
      merge_max[warp * 16 + r] = softmax.row_max[0][h];
      merge_sum[warp * 16 + r] = softmax.row_sum[0][h];
    }
  }
  __syncthreads();

  // Each thread: 4 consecutive columns of one row at a time.
  constexpr int kQuads = kD / 4;
  for (int item = tid; item < Cfg::kRows * kQuads; item += Cfg::kThreads) {
    const int r = item / kQuads, col = (item % kQuads) * 4, row = r0 + r;
    if (row >= rows_total) continue;
    // Row r's slots: warps (r / 16) * kKeyWarps .. + kKeyWarps - 1, row r % 16.
    const int slot0 = (r / 16) * Cfg::kKeyWarps * 16 + r % 16;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Cfg::kKeyWarps; ++w) m = fmaxf(m, merge_max[slot0 + w * 16]);
    // The rounded products of softmax_online.cuh (scaled()): the largest
    // warp's factor is exactly 1 at any score, where an FMA against a rounded
    // base gave 2^(+-half an ulp of it), inf or 0 from base 2^31 on.
    const float base = m == -INFINITY ? 0.f : scaled(m, a.scale_log2);
    float sum = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < Cfg::kKeyWarps; ++w) {
      const int slot = slot0 + w * 16;
      const float f = ex2(scaled(merge_max[slot], a.scale_log2) - base);  // 0 for a warp that saw no key
      sum += f * merge_sum[slot];
      const float4 v = *reinterpret_cast<const float4*>(merge + slot * Cfg::kMergeStride + col);
      o.x += f * v.x;
      o.y += f * v.y;
      o.z += f * v.z;
      o.w += f * v.w;
    }
    // sum != 0: a NaN sum (a NaN score, or one from a NaN or inf input) gives NaN,
    // as the float64 reference does; only a row that saw no key gives zeros.
    const float inv = sum != 0.f ? 1.f / sum : 0.f;
    // Natural-log LSE of the scaled scores; -inf where no key was seen (a split's
    // "nothing here"), which the one-split path turns into +inf (a fully masked row).
    const float lse = sum != 0.f ? (base + __log2f(sum)) * 0.6931471805599453f : -INFINITY;
    const int qi = row / a.group, head = kv_head * a.group + row % a.group;
    const std::int64_t row_id = (static_cast<std::int64_t>(batch) * a.heads + head) * a.seq_q + qi;
    if (d.num_splits == 1) {
      std::uint16_t* const dst = a.o + batch * a.o_batch_stride + head * a.o_head_stride + qi * a.o_row_stride + col;
      *reinterpret_cast<uint2*>(dst) =
          make_uint2(pack2<Element>(o.x * inv, o.y * inv), pack2<Element>(o.z * inv, o.w * inv));
      if (a.lse != nullptr && col == 0) a.lse[row_id] = sum != 0.f ? lse : INFINITY;
    } else {
      const std::int64_t rows_all = static_cast<std::int64_t>(a.batch) * a.heads * a.seq_q;
      *reinterpret_cast<float4*>(d.o_partial + (split * rows_all + row_id) * kD + col) =
          make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
      if (col == 0) d.lse_partial[split * rows_all + row_id] = lse;
    }
  }
  if (d.tile_counters == nullptr || d.num_splits == 1) return;
  // The fused combine: this CTA's partials stored and made visible, the tile's
  // count taken; the split that counts last reads every split's partials of
  // its rows (the others' are visible to it: their fence came before their
  // count) and merges them, then zeroes the count for the next launch.
  __shared__ int merges;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    unsigned* const counter = d.tile_counters + static_cast<std::int64_t>(batch) * gridDim.y + blockIdx.y;
    merges = atomicAdd(counter, 1u) == static_cast<unsigned>(d.num_splits - 1);
    if (merges) *counter = 0u;  // every split has counted: nothing else touches it in this launch
  }
  __syncthreads();
  if (!merges) return;
  __threadfence();
  for (int r = warp; r < Cfg::kRows && r0 + r < rows_total; r += Cfg::kWarps) {
    const int row = r0 + r, qi = row / a.group, head = kv_head * a.group + row % a.group;
    merge_splits<kD, Element>(d, (static_cast<std::int64_t>(batch) * a.heads + head) * a.seq_q + qi, lane);
  }
}

// Merges num_splits partial results of row `row_id` (B x H x seq_q order), one
// warp: weights e^(lse_s - max), O = sum_s w_s O_s / sum_s w_s, LSE = max +
// ln(sum_s w_s) (+inf when no split saw a key: the row is fully masked and
// written as zeros); num_splits <= kFlashDecodeMaxSplits = 64, two a lane. The
// partials are read from L2 (ld.global.cg): other CTAs wrote them, and the
// last split of a tile (flash_decode_splitkv_kernel) reads them in the grid
// that wrote them.
template <int kHeadDim, Half16 Element>
__device__ void merge_splits(const DecodeArgs& d, std::int64_t row_id, int lane) {
  static_assert(kFlashDecodeMaxSplits <= 64, "two splits a lane");
  constexpr int kPerLane = kHeadDim / 32;
  static_assert(kPerLane >= 2 && kPerLane % 2 == 0, "pairs of columns a lane");
  const FwdArgs& a = d.a;
  const std::int64_t rows_all = static_cast<std::int64_t>(a.batch) * a.heads * a.seq_q;
  float l0 = -INFINITY, l1 = -INFINITY;
  if (lane < d.num_splits) l0 = __ldcg(d.lse_partial + lane * rows_all + row_id);
  if (lane + 32 < d.num_splits) l1 = __ldcg(d.lse_partial + (lane + 32) * rows_all + row_id);
  float m = fmaxf(l0, l1);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float base = m == -INFINITY ? 0.f : m;
  const float w0 = __expf(l0 - base), w1 = __expf(l1 - base);  // e^-inf = 0
  float sum = w0 + w1;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  float o[kPerLane] = {};
  const int col0 = lane * kPerLane;
  // kBatch splits' loads are issued before any is summed: the partials come
  // from L2, and one split a round trip left a 32-split row at 32 latencies
  // (6.5 us of a 12 us decode at batch 1, session 27's profile).
  constexpr int kBatch = 8;
  for (int s0 = 0; s0 < d.num_splits; s0 += kBatch) {
    float w[kBatch];
    float2 v[kBatch][kPerLane / 2];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int s = s0 + i;  // uniform across the warp, so the shuffle is too
      w[i] = __shfl_sync(0xffffffffu, s < 32 ? w0 : w1, s % 32);
      if (s >= d.num_splits) w[i] = 0.f;
      const float* src = d.o_partial + (s * rows_all + row_id) * kHeadDim + col0;
#pragma unroll
      for (int e = 0; e < kPerLane; e += 2) {
        // a split with weight 0 (no key, or past num_splits) is not read: its partial may be anything
        v[i][e / 2] = w[i] != 0.f ? __ldcg(reinterpret_cast<const float2*>(src + e)) : make_float2(0.f, 0.f);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
#pragma unroll
      for (int e = 0; e < kPerLane; e += 2) {
        o[e] += w[i] * v[i][e / 2].x;
        o[e + 1] += w[i] * v[i][e / 2].y;
      }
    }
  }
  const float inv = sum != 0.f ? 1.f / sum : 0.f;  // a split's NaN LSE makes its weight, and the row, NaN
  const int qi = static_cast<int>(row_id % a.seq_q);
  const std::int64_t bh = row_id / a.seq_q;
  const int head = static_cast<int>(bh % a.heads), batch = static_cast<int>(bh / a.heads);
  std::uint16_t* const dst = a.o + batch * a.o_batch_stride + head * a.o_head_stride + qi * a.o_row_stride + col0;
#pragma unroll
  for (int e = 0; e < kPerLane; e += 2) {
    *reinterpret_cast<std::uint32_t*>(dst + e) = pack2<Element>(o[e] * inv, o[e + 1] * inv);
  }
  if (a.lse != nullptr && lane == 0) a.lse[row_id] = sum != 0.f ? base + __logf(sum) : INFINITY;
}

// The combine kernel: merge_splits over every row, one warp a row.
template <int kHeadDim, Half16 Element>
__global__ void __launch_bounds__(128) flash_decode_combine_kernel(const __grid_constant__ DecodeArgs d) {
  const std::int64_t rows_all = static_cast<std::int64_t>(d.a.batch) * d.a.heads * d.a.seq_q;
  const std::int64_t row_id = static_cast<std::int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row_id >= rows_all) return;
  wait_prior_grid();  // the partials are the split kernel's (launch_after_prior): all of them have landed
  merge_splits<kHeadDim, Element>(d, row_id, threadIdx.x % 32);
}

// Launches the split kernel (grid: num_splits, Hkv * row_blocks, batch) and,
// when num_splits > 1, the combine kernel after it on the same stream (a
// programmatic dependent launch with after_prior: sm90 on; its wait is a
// no-op below sm90). The shared-memory opt-in is made once per kernel (the
// first call).
template <class Cfg, Half16 Element, bool kPaged>
cudaError_t launch_flash_decode_split(const DecodeArgs& d, cudaStream_t stream) {
  if (const cudaError_t e = opt_in_shared_memory(flash_decode_splitkv_kernel<Cfg, Element, kPaged>, Cfg::kSmemBytes);
      e != cudaSuccess) {
    return e;
  }
  const int kv_heads = d.a.heads / d.a.group;
  flash_decode_splitkv_kernel<Cfg, Element, kPaged>
      <<<dim3(d.num_splits, kv_heads * d.row_blocks, d.a.batch), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(d);
  return cudaGetLastError();
}

template <int kHeadDim, Half16 Element, bool kPaged>
cudaError_t launch_flash_decode_kernels(const DecodeArgs& d, bool after_prior, cudaStream_t stream) {
  if (d.rows != kFlashDecodeRows && d.rows != kFlashDecodeWideRows) return cudaErrorInvalidValue;
  const cudaError_t split = d.rows == kFlashDecodeWideRows
                                ? launch_flash_decode_split<DecodeCfg<kHeadDim, 4>, Element, kPaged>(d, stream)
                                : launch_flash_decode_split<DecodeCfg<kHeadDim, 1>, Element, kPaged>(d, stream);
  if (split != cudaSuccess || d.num_splits == 1 || d.tile_counters != nullptr) return split;  // merged in the grid
  const std::int64_t rows_all = static_cast<std::int64_t>(d.a.batch) * d.a.heads * d.a.seq_q;
  const dim3 grid(static_cast<unsigned>((rows_all + 3) / 4));
  if (!after_prior) {
    flash_decode_combine_kernel<kHeadDim, Element><<<grid, 128, 0, stream>>>(d);
    return cudaGetLastError();
  }
  // Launched to start as the split kernel ends: its launch and the blocks' start overlap that kernel's last blocks.
  return launch_after_prior(flash_decode_combine_kernel<kHeadDim, Element>, grid, 128, 0, stream, d);
}

// Instantiations at one head dim: `template` in flash_decode_hdim<D>.cu,
// `extern template` where the launch is dispatched (so that file compiles none).
#define ATTNPROF_DECODE_INSTANTIATE(prefix, head_dim)                                                           \
  prefix cudaError_t launch_flash_decode_kernels<head_dim, Bf16, false>(const DecodeArgs&, bool, cudaStream_t); \
  prefix cudaError_t launch_flash_decode_kernels<head_dim, Bf16, true>(const DecodeArgs&, bool, cudaStream_t);  \
  prefix cudaError_t launch_flash_decode_kernels<head_dim, Fp16, false>(const DecodeArgs&, bool, cudaStream_t); \
  prefix cudaError_t launch_flash_decode_kernels<head_dim, Fp16, true>(const DecodeArgs&, bool, cudaStream_t);

}  // namespace attnprof::cuda::kernels
