// Host-side arguments of the fused attention kernels (efficient, flash), and
// the head dims they are built for. Plain data so that kernels depend on
// nothing above them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "attnprof/mask.h"

namespace attnprof::cuda {

// The head dims every fused kernel is instantiated for (one translation unit
// per kernel and head dim: src/backends/cuda/instantiations/*_hdim*.cu), and those that
// flash's sm90a kernel takes (192 on sm90 only: no sm80 kernel is built for it). Dispatch, the eligibility checks and
// the tests read these lists; adding a head dim means adding its instance files.
inline constexpr std::array<int, 5> kFusedHeadDims = {32, 64, 96, 128, 256};
inline constexpr std::array<int, 5> kFlashSm90HeadDims = {64, 96, 128, 192, 256};
// The head dims the fused backward is built for (src/backends/cuda/instantiations/flash_bwd_sm80_hdim*.cu).
// 256 is left out: dK and dV of a warp's 16 keys alone would be 256 f32 a thread.
inline constexpr std::array<int, 4> kFusedBwdHeadDims = {32, 64, 96, 128};
// The head dims of flash's sm90a backward (kernels/flash_bwd_sm90.cuh,
// flash_bwd_sm90_hdim*.cu; 192 and 256 on sm90 only); the others take the
// sm80 kernel where it is built.
inline constexpr std::array<int, 5> kFlashSm90BwdHeadDims = {64, 96, 128, 192, 256};
// The backward's workspace rows per (batch, head): seq_q rounded up to this,
// so that the sm90 kernel reads a query tile's LSE and D and adds its dQ rows
// whole (bulk copies, no bounds checks).
// flash's FP8 (e4m3) forward: sm90a, one head dim.
inline constexpr int kFlashFp8HeadDim = 128;
inline constexpr int kBwdRowPad = 128;
constexpr std::int64_t bwd_padded_rows(std::int64_t seq_q) {
  return (seq_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
}

// The head dims of flash's split-KV decode kernel (kernels/flash_decode.cuh,
// flash_decode_hdim*.cu): the only kernel of ours that reads a paged cache.
inline constexpr std::array<int, 3> kFlashDecodeHeadDims = {64, 128, 256};
// Query lengths up to this take the decode kernel on a contiguous cache;
// longer ones the prefill kernels (a paged cache always takes it).
inline constexpr int kFlashDecodeMaxQueries = 16;
// Its tile: packed query rows (queries x the heads of a group) and keys; and
// the most key ranges it splits into (the combine kernel's lanes hold two each).
inline constexpr int kFlashDecodeRows = 16;
inline constexpr int kFlashDecodeWideRows = 64;  // a KV head's many rows: 4 warps of 16 (DecodeCfg)
inline constexpr int kFlashDecodeKeys = 64;
inline constexpr int kFlashDecodeMaxSplits = 64;

// How many key ranges the split-KV decode cuts each (batch, KV head, row tile)'s keys into: its `ctas` CTAs
// before the split, on `sms` multiprocessors that each hold `per_sm` of its CTAs (shared memory), over `key_tiles`
// tiles of kFlashDecodeKeys keys. Measured on the H100 (132 SMs, two CTAs an SM at head dim 128; docs/perf/decode.md,
// 2026-12-07 session 29, one query, 32/8 heads, pages of 16):
// - Fewer CTAs than SMs: one range an SM, each as short as that makes it: at batch 1 and 2048 keys, 16 ranges of
//   2 tiles ran in 11.0 us against 13.1 for 32 of 1 tile (two an SM) and 12.8 for 8 of 4.
// - Then the SMs' further slots, where each range keeps kDecodeSplitMinSharedTiles tiles for its pipeline: at
//   8192 keys 32 ranges of 4 tiles (two an SM) 19.6 us, against 20.8 for 16 of 8; 4 x 32/8 x 8192 contiguous:
//   8 ranges 51.5 us where FlashAttention-2's wave rule below took 7 (53.9: 92 SMs with two, 40 with one).
// - As many CTAs as SMs or more: FlashAttention-2's rule, the fewest ranges whose last wave is nearly as full as
//   the best count's, among counts that give distinct ranges (16 x 32/8 at 2048 keys: 2 ranges, 53.5 us, against
//   56.5 for 4).
inline constexpr int kDecodeSplitMinSharedTiles = 4;
constexpr int decode_splits(std::int64_t ctas, int sms, int per_sm, int key_tiles) {
  if (key_tiles < 2 || sms <= 0 || ctas <= 0 || ctas >= (std::int64_t{1} << 30)) return 1;
  const int n = static_cast<int>(ctas);
  const int most = std::min(kFlashDecodeMaxSplits, key_tiles);
  if (n < sms) {
    const int one_an_sm = std::min(most, sms / n);
    const int shared = per_sm > 1 ? std::min(key_tiles / kDecodeSplitMinSharedTiles, sms * per_sm / n) : 0;
    return std::max(1, std::min(most, std::max(one_an_sm, shared)));
  }
  const int slots = sms * std::max(1, per_sm);
  if (n >= slots * 4 / 5) return 1;
  const int cap = std::min(most, (slots + n - 1) / n * 2);
  double eff[kFlashDecodeMaxSplits + 1] = {};
  double best = 0;
  for (int s = 1; s <= cap; ++s) {
    if (s > 1 && (key_tiles + s - 1) / s == (key_tiles + s - 2) / (s - 1)) continue;  // the same ranges as s - 1
    const double waves = static_cast<double>(n) * s / slots;
    const double whole = static_cast<double>(static_cast<std::int64_t>(waves)) < waves
                             ? static_cast<double>(static_cast<std::int64_t>(waves) + 1)
                             : waves;
    eff[s] = waves / whole;
    best = std::max(best, eff[s]);
  }
  for (int s = 1; s <= cap; ++s) {
    if (eff[s] >= 0.85 * best) return s;
  }
  return 1;
}

// The bits of the device's input-error word (FusedParams::input_errors).
inline constexpr unsigned kInputBadKeyCount = 1u;  // a sequence's key rows (kv_rows) outside 0 .. the keys
inline constexpr unsigned kInputBadPage = 2u;      // a block table entry outside the cache's pages
// A packed batch's cumulative lengths (read on the device only) that decrease, leave 0 .. the packed rows, give
// a sequence more rows than max_seqlen, or do not start at 0 and end at the rows.
inline constexpr unsigned kInputBadCuSeqlens = 4u;

constexpr bool fused_head_dim_built(int head_dim) {
  return std::find(kFusedHeadDims.begin(), kFusedHeadDims.end(), head_dim) != kFusedHeadDims.end();
}
constexpr bool flash_sm90_head_dim(int head_dim) {
  return std::find(kFlashSm90HeadDims.begin(), kFlashSm90HeadDims.end(), head_dim) != kFlashSm90HeadDims.end();
}
constexpr bool flash_decode_head_dim(int head_dim) {
  return std::find(kFlashDecodeHeadDims.begin(), kFlashDecodeHeadDims.end(), head_dim) != kFlashDecodeHeadDims.end();
}
constexpr bool fused_bwd_head_dim_built(int head_dim) {
  return std::find(kFusedBwdHeadDims.begin(), kFusedBwdHeadDims.end(), head_dim) != kFusedBwdHeadDims.end();
}
constexpr bool flash_sm90_bwd_head_dim(int head_dim) {
  return std::find(kFlashSm90BwdHeadDims.begin(), kFlashSm90BwdHeadDims.end(), head_dim) != kFlashSm90BwdHeadDims.end();
}

struct FusedParams {
  const void* q = nullptr;  // [B, H, Sq, D], head_dim contiguous
  const void* k = nullptr;  // [B, Hkv, Sk, D]
  const void* v = nullptr;  // [B, Hkv, Sk, D]
  void* o = nullptr;        // [B, H, Sq, D]
  // [B, H, Sq] float, contiguous: each query row's log-sum-exp (natural log) of
  // its scaled scores, +inf for a fully masked row. Written only when not null.
  float* lse = nullptr;
  // Element strides of batch, head and row; head_dim has stride 1.
  std::int64_t q_batch_stride = 0, q_head_stride = 0, q_row_stride = 0;
  std::int64_t k_batch_stride = 0, k_head_stride = 0, k_row_stride = 0;
  std::int64_t v_batch_stride = 0, v_head_stride = 0, v_row_stride = 0;
  std::int64_t o_batch_stride = 0, o_head_stride = 0, o_row_stride = 0;
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  float scale = 0.f;  // softmax scale
  // The problem's mask; the kernels take the structural ones (not Boolean, Bias).
  MaskKind mask = MaskKind::None;
  int window = 0;    // SlidingWindow: keys j with i + (Sk - Sq) - window < j <= i + (Sk - Sq)
  bool bf16 = true;  // false: fp16
  // A paged KV cache (flash's decode kernel only): k and v point at pages
  // [num_pages, Hkv, page_size, D], k_batch_stride (v_batch_stride) is the
  // stride of one page, and sequence b's key j is in page
  // block_table[b * pages_per_seq + j / page_size] (device int32), row
  // j % page_size. page_size is a power of two; 0: a contiguous cache.
  const std::int32_t* block_table = nullptr;
  int page_size = 0, pages_per_seq = 0;
  // The cache's physical pages: a table entry outside [0, num_pages) is read
  // as a page of masked keys (none of its rows is loaded), whatever the table
  // holds, since it is read only on the device (attnprof/check_inputs.h).
  int num_pages = 0;
  // The device's input-error word (device_input_errors()), or null: a kernel
  // that clamps a per-sequence length or masks a bad page ORs in
  // kInputBadKeyCount or kInputBadPage, and a packed batch's clamped
  // cumulative lengths kInputBadCuSeqlens.
  unsigned* input_errors = nullptr;
  // The decode kernel's FP32 workspace when it splits the keys
  // (flash_decode_plan(...).workspace_bytes), else unused.
  float* workspace = nullptr;
  // Sequences of their own lengths (flash's kernels, sm90 and sm80; the others
  // refuse them, fused_unsupported_reason):
  //  - a packed batch: q, o [total_q rows], k, v [total_k rows] with batch
  //    stride 0, sequence b's rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1
  //    (device int32 [batch + 1], from 0; likewise cu_seqlens_k); seq_q and
  //    seq_k are the longest sequence's; the LSE is [1, H, total_q];
  //  - a dense batch's rows (Inputs::q_rows, kv_rows): sequence b's queries
  //    are rows q_rows[2b] .. q_rows[2b + 1] - 1 of Q and O, its keys rows
  //    kv_rows[2b] .. kv_rows[2b + 1] - 1 of K and V (device int32 [batch][2];
  //    null: every row). Read on the device only, in stream order, and
  //    clamped there into 0 <= begin <= end <= seq_q (seq_k), so that no
  //    kernel reads outside a tensor whatever they hold. Rows of O outside a
  //    sequence's query rows are written as zeros (their LSE +inf), and so
  //    are dQ's rows outside them and dK's and dV's outside its key rows.
  // The mask's band (and the bottom-right alignment) is each sequence's own.
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  int total_q = 0, total_k = 0;
  const std::int32_t* q_rows = nullptr;
  const std::int32_t* kv_rows = nullptr;
  int kv_rows_width = 2;  // 2: kv_rows holds (begin, end) pairs; 1: key ends alone (begin 0, a paged call's seq_lens)
  // Soft-capping (Problem::softcap): scaled scores s become tanh(s / softcap)
  // softcap before the mask; 0: none.
  float softcap = 0.f;
  // FP8 inputs (flash's sm90 forward only, kernels/flash_fwd_sm90_fp8.cuh):
  // q, k and v hold e4m3 (real value = stored x descale), o is bf16, strides
  // count bytes; v_t is the [B, Hkv, head_dim, fp8_vt_cols(seq_k)] e4m3
  // buffer (fp8_vt_bytes) the launch writes V^T into before the kernel reads it.
  bool fp8 = false;
  float q_descale = 1.f, k_descale = 1.f, v_descale = 1.f;
  // The descales as device floats (Inputs::q_descale_tensor ...), or null:
  // the kernel multiplies its scale by *q_descale_device x *k_descale_device
  // and O by *v_descale_device, read on the device (the floats are then 1).
  const float* q_descale_device = nullptr;
  const float* k_descale_device = nullptr;
  const float* v_descale_device = nullptr;
  void* v_t = nullptr;

  bool per_sequence() const { return cu_seqlens_q != nullptr || dense_rows(); }
  bool dense_rows() const { return q_rows != nullptr || kv_rows != nullptr; }
};

// Arguments of the fused backward (kernels/flash_bwd_sm80.cuh): the forward's
// problem and tensors (fwd.o is the forward's output O, fwd.lse its saved
// log-sum-exp, both read), the upstream gradient dO, the gradients and the
// FP32 workspace.
// V^T's keys a row for an FP8 forward: seq_k rounded up to 16 (TMA's
// 16-byte strides, and the pre-pass's 16-key permutation groups).
constexpr std::int64_t fp8_vt_cols(std::int64_t seq_k) { return (seq_k + 15) / 16 * 16; }
constexpr std::size_t fp8_vt_bytes(const FusedParams& p) {
  return static_cast<std::size_t>(p.batch) * static_cast<std::size_t>(p.kv_heads) *
         static_cast<std::size_t>(p.head_dim) * static_cast<std::size_t>(fp8_vt_cols(p.seq_k));
}

struct FusedBwdParams {
  FusedParams fwd;
  const void* dout = nullptr;  // [B, H, Sq, D], head_dim contiguous
  std::int64_t do_batch_stride = 0, do_head_stride = 0, do_row_stride = 0;
  void* dq = nullptr;  // [B, H, Sq, D]
  void* dk = nullptr;  // [B, Hkv, Sk, D]
  void* dv = nullptr;  // [B, Hkv, Sk, D]
  std::int64_t dq_batch_stride = 0, dq_head_stride = 0, dq_row_stride = 0;
  std::int64_t dk_batch_stride = 0, dk_head_stride = 0, dk_row_stride = 0;
  std::int64_t dv_batch_stride = 0, dv_head_stride = 0, dv_row_stride = 0;
  // Workspace (FusedBwdWorkspace says which a path needs), FP32 and
  // contiguous, rows padded to bwd_padded_rows(seq_q): D = rowsum(dO * O)
  // [B, H, rows]; the LSE in log2 units [B, H, rows] (sm90); the dQ
  // accumulator [B, H, rows, dq_accum_cols] (sm90 always, in its 64-row
  // tiles' register order; sm80 unless deterministic); the ordered-dQ
  // semaphores, int32 [B, H, rows / 64] (sm90, deterministic).
  float* dsum = nullptr;
  float* lse_log2 = nullptr;
  float* dq_accum = nullptr;
  int* dq_semaphore = nullptr;
  int dq_accum_cols = 0;  // FusedBwdWorkspace::dq_accum_cols
  // sm90: how many CTAs share each key tile's grouped-query group, each
  // walking group / group_split of its query heads (flash_sm90_bwd_group_split);
  // above 1 each writes its FP32 dK and dV partial sums, [2][group_split][B,
  // Hkv, Sk, padded head dim] (dK's, then dV's), summed in order into dK and dV
  // by a last kernel.
  int group_split = 1;
  float* dkv_partial = nullptr;
  // Bitwise repeatable dQ: on sm80 a second kernel per query tile loops over
  // the key tiles in a fixed order (dq_accum unused); on sm90 the key tiles
  // add into the accumulator in key order, each waiting on its semaphore.
  bool deterministic = false;
};

// The sm90 backward's key tile (kernels/mainloop_bwd_sm90.cuh's
// FlashBwdSm90Cfg::kBlockN, which asserts it): 128 keys up to head dim 128,
// 64 past it.
constexpr int flash_sm90_bwd_block_n(int head_dim) { return (head_dim + 63) / 64 * 64 > 128 ? 64 : 128; }

// What sizes a backward's workspace (and picks the sm90 kernel's group split).
struct FusedBwdShape {
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  bool deterministic = false;
  bool sm90 = false;
  bool masked = true;   // any mask but none: the grid's order (bwd_sm90_key_tile_fastest)
  int group_split = 1;  // FusedBwdParams::group_split (sm90)
};

// The sm90 backward's grid order, decided at launch (kernels/bwd_order_sm90.cuh
// says why, and its BwdOrderSm90 calls these): whether the key tile goes
// fastest (a wave holds a few (kv head, batch) pairs whole), else in how many
// chunks of pairs the grid runs, each in key-tile order (a wave holds the
// first key tiles of every pair of its chunk). Here so that the group split
// (bwd_sm90_group_split) reads the order the kernel will run in. The wide head
// dims (padded past 128) take the key tile fastest; at 256 (padded past 192)
// the consumers take the deterministic turns themselves (no room to stage dQ).
constexpr bool bwd_sm90_key_tile_fastest(bool deterministic, bool masked, std::int64_t pad_dim, std::int64_t key_tiles,
                                         int multiprocessors) {
  if (!deterministic) return !masked || pad_dim > 128;
  return (!masked || pad_dim > 192) && key_tiles <= multiprocessors;
}
// Chunks of at least two waves of CTAs (2 x the multiprocessors); a grid of
// less than four waves is one chunk, and so is a deterministic one.
constexpr std::int64_t bwd_sm90_chunks(bool deterministic, std::int64_t key_tiles, std::int64_t pairs,
                                       int multiprocessors) {
  if (deterministic) return 1;
  const std::int64_t width = (2 * multiprocessors + key_tiles - 1) / key_tiles;  // a chunk's fewest pairs
  return pairs / width > 1 ? pairs / width : 1;
}

// flash's sm90 backward: how many CTAs share each key tile's grouped-query
// group (FusedBwdParams::group_split), a divisor of the group; 1 for packed
// batches and where the group is 1. One CTA per (key tile, kv head, batch)
// walks group / split query heads, keeping dK and dV in registers; above 1
// each CTA writes FP32 partial sums of dK and dV that a last kernel adds (2 x
// split x B x Hkv x Sk x D x 4 bytes written and read again), so the fewest
// parts that meet both of these (where no split meets the second, the one
// whose wave streams least):
// - enough CTAs: 1.9 waves of the multiprocessors (two, less the last
//   wave's few: 8 x 8/1 x 1024 x 64 causal ran in 94 us on split 4's 256
//   CTAs against 113 on split 8's 512, H100);
// - a wave's query heads near L2: the pairs a wave runs at once (the grid's
//   order above) times the query heads each walks, each head's Q, dO and FP32
//   dQ accumulator (seq_q x (4 D + 4 padded D) bytes), at most 2.5 x the L2.
//   A wave of the whole group in one CTA streams every head of every pair
//   from DRAM. On the H100 (50 MB of L2; docs/perf/backward.md, 2026-12-07)
//   8 x 32/8 x 1024 x 128 causal took 766 us with the group in one CTA (256
//   MB a wave), 679 split in 2 (85 MB), 721 in 4 (37 MB, twice the partial
//   sums), its multi-head twin 659; at 128 MB (4 x 16/4 x 2048 x 128, one
//   CTA or two) 496-503 us against the twin's 459; 1 x 16/4 x 16384 x 128
//   causal (256 MB) 5.43 ms against the twin's 4.60, 4.92 split in 4.
// Then one divisor more where a masked grid's CTAs are few and heavy: under
// 3 waves, each CTA walking 8192 query rows or more (its heads x seq_q). The
// first key tiles of a causal grid see every query, the last few; with two
// CTAs an SM the heavy ones leave SMs idle at the end for a long time, and
// halving each CTA's heads costs only the partial sums, small beside them:
// 2 x 16/1 x 4096 x 96 causal ran 752 us split in 4 (256 CTAs of 16384 rows),
// 687 in 8, 737 in 16, where 8 x 8/1 x 1024 x 64's light CTAs (2048 rows) ran
// best at 256 (H100, 2026-12-07).
constexpr int bwd_sm90_group_split(const FusedBwdShape& s, bool packed, int multiprocessors, std::int64_t l2_bytes) {
  const std::int64_t group = s.kv_heads > 0 ? s.heads / s.kv_heads : 1;
  if (!s.sm90 || packed || group <= 1 || multiprocessors <= 0) return 1;
  const std::int64_t pad_dim = (s.head_dim + 63) / 64 * 64;
  const std::int64_t block_n = flash_sm90_bwd_block_n(static_cast<int>(s.head_dim));
  const std::int64_t key_tiles = (s.seq_k + block_n - 1) / block_n;
  const std::int64_t pairs = s.kv_heads * s.batch;
  const std::int64_t head_bytes = s.seq_q * (4 * s.head_dim + 4 * pad_dim);
  const bool fastest = bwd_sm90_key_tile_fastest(s.deterministic, s.masked, pad_dim, key_tiles, multiprocessors);
  // Where no split fits (a deterministic grid runs as one chunk: every
  // split's wave spans every head), the one whose wave is least, the fewest
  // parts among equals: parts that stream as much cost only their sums.
  std::int64_t chosen = 0, best_bytes = 0;
  for (std::int64_t split = 1; split <= group; ++split) {
    if (group % split != 0) continue;
    const std::int64_t units = pairs * split;
    if (split < group && key_tiles * units * 10 < 19 * static_cast<std::int64_t>(multiprocessors)) continue;
    const std::int64_t chunks = bwd_sm90_chunks(s.deterministic, key_tiles, units, multiprocessors);
    const std::int64_t at_once =
        fastest ? (multiprocessors + key_tiles - 1) / key_tiles : (units + chunks - 1) / chunks;
    const std::int64_t wave_bytes = (at_once < units ? at_once : units) * (group / split) * head_bytes;
    if (l2_bytes <= 0 || 2 * wave_bytes <= 5 * l2_bytes) {
      chosen = split;
      break;
    }
    if (chosen == 0 || wave_bytes < best_bytes) chosen = split, best_bytes = wave_bytes;
  }
  // Few heavy CTAs under a mask: the next divisor.
  const bool few_heavy = s.masked && key_tiles * pairs * chosen < 3 * static_cast<std::int64_t>(multiprocessors) &&
                         s.seq_q * (group / chosen) >= 8192;
  for (std::int64_t next = chosen + 1; few_heavy && next <= group; ++next) {
    if (group % next == 0) return static_cast<int>(next);
  }
  return static_cast<int>(chosen);
}

// The workspace a backward needs, in 4-byte elements per part (0: not
// needed), and the dQ accumulator's columns (the sm90 kernel's padded head dim).
struct FusedBwdWorkspace {
  std::int64_t dsum = 0, lse_log2 = 0, dq_accum = 0, dq_semaphore = 0, dkv_partial = 0;
  int dq_accum_cols = 0;
  std::int64_t total() const { return dsum + lse_log2 + dq_accum + dq_semaphore + dkv_partial; }
};
constexpr FusedBwdWorkspace fused_bwd_workspace(const FusedBwdShape& s) {
  const std::int64_t rows = s.batch * s.heads * bwd_padded_rows(s.seq_q);
  const std::int64_t pad_dim = (s.head_dim + 63) / 64 * 64;
  FusedBwdWorkspace w;
  w.dsum = rows;
  w.dq_accum_cols = static_cast<int>(s.sm90 ? pad_dim : s.head_dim);
  if (s.sm90) w.lse_log2 = rows;
  if (s.sm90 || !s.deterministic) w.dq_accum = rows * w.dq_accum_cols;
  // Rounded up to a multiple of 4 elements: the parts after it stay 16-byte aligned.
  if (s.sm90 && s.deterministic) w.dq_semaphore = (rows / 64 + 3) / 4 * 4;
  if (s.sm90 && s.group_split > 1) w.dkv_partial = 2 * s.group_split * s.batch * s.kv_heads * s.seq_k * pad_dim;
  return w;
}

}  // namespace attnprof::cuda
