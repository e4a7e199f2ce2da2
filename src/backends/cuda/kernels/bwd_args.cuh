// Device-side arguments of the fused backwards (flash_bwd_sm80.cuh,
// flash_bwd_sm90.cuh), made from the host-side FusedBwdParams in one place
// (BwdArgs::from): the forward's FwdArgs (its tensors, shape and mask
// geometry; O and the saved log-sum-exp read) and the backward's own tensors
// and workspace. The workspace's rows are padded to kBwdRowPad per (batch,
// head) (fused_params.h), so that a query tile's LSE, D and dQ accumulator
// rows are whole and in bounds for the sm90 kernel's bulk copies.
#pragma once

#include <cstdint>

#include "backends/cuda/fused_params.h"
#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

struct BwdArgs {
  FwdArgs f;  // q, k, v, o (O of the forward), their strides, sizes, mask, lse (read)
  const std::uint16_t* dout;
  std::int64_t do_batch_stride, do_head_stride, do_row_stride;
  std::uint16_t* dq;
  std::uint16_t* dk;
  std::uint16_t* dv;
  std::int64_t dq_batch_stride, dq_head_stride, dq_row_stride;
  std::int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  std::int64_t dv_batch_stride, dv_head_stride, dv_row_stride;
  float* dsum;        // [B, H, rows_pad]
  float* lse_log2;    // [B, H, rows_pad]: the LSE in log2 units, +inf past seq_q (sm90), or null
  float* dq_accum;    // [B, H, rows_pad, dq_accum_cols] (sm90: tiles in register order), or null
  int* dq_semaphore;  // [B, H, rows_pad / 64]: sm90's ordered dQ (deterministic), or null
  float scale;        // softmax scale (dQ = scale dS K, dK = scale dS^T Q)
  int head_dim;
  int rows_pad;       // bwd_padded_rows(seq_q)
  int dq_accum_cols;  // head_dim (sm80), padded to 64 (sm90)
  bool deterministic;
  bool key_tile_fastest = false;  // sm90: the grid's order, set at launch (FlashBwdSm90::key_tile_fastest)
  int chunks = 1;                 // sm90, key tile slowest: chunks of (kv head, batch) pairs (FlashBwdSm90::chunks)
  // sm90: the CTAs each key tile's group of query heads is split among, and
  // (above 1) their FP32 partial dK and dV (FusedBwdParams::group_split).
  int group_split = 1;
  float* dkv_partial = nullptr;

  // The query heads that part `part` of kv head `kv_head`'s group walks.
  struct Heads {
    int first, count;
  };
  __device__ __forceinline__ Heads heads_of(int kv_head, int part) const {
    const int n = f.group / group_split;
    return {kv_head * f.group + part * n, n};
  }

  // Sequence b (FwdArgs::sequence), with dO's and the gradients' addresses
  // of its first rows too (packed, or a dense batch's rows); itself when
  // dense. The workspace keeps its [B, H, rows_pad] rows (rows_pad from the
  // longest sequence, or the tensors' rows), indexed by the sequence's rows.
  __device__ __forceinline__ BwdArgs sequence(int b) const {
    BwdArgs s = *this;
    if (!f.per_sequence()) return s;
    s.f = f.sequence(b);
    s.dout += s.f.q_row0 * do_row_stride;
    s.dq += s.f.q_row0 * dq_row_stride;
    s.dk += s.f.k_row0 * dk_row_stride;
    s.dv += s.f.k_row0 * dv_row_stride;
    return s;
  }

  // A dense batch's rows (FwdArgs::q_spans, kv_spans): the rows of the
  // tensor tile at t0 (n rows) of dQ (query head `head`), or of dK and dV
  // (kv head `kv_head`), that lie outside sequence `seq`'s rows, written as
  // zeros (zero_rows_outside). `this` is the batch's arguments.
  __device__ __forceinline__ void zero_dq_rows_outside(const BwdArgs& seq, int batch, int head, int t0, int n, int tid,
                                                       int threads) const {
    if (f.q_spans == nullptr) return;
    zero_rows_outside(
        dq + batch * dq_batch_stride + head * dq_head_stride, dq_row_stride, head_dim, t0, n, f.seq_q,
        [&](int row) { return seq.f.q_row_outside(row); }, tid, threads);
  }
  __device__ __forceinline__ void zero_dkdv_rows_outside(const BwdArgs& seq, int batch, int kv_head, int t0, int n,
                                                         int tid, int threads) const {
    if (f.kv_spans == nullptr) return;
    const auto outside = [&](int row) { return seq.f.k_row_outside(row); };
    zero_rows_outside(dk + batch * dk_batch_stride + kv_head * dk_head_stride, dk_row_stride, head_dim, t0, n, f.seq_k,
                      outside, tid, threads);
    zero_rows_outside(dv + batch * dv_batch_stride + kv_head * dv_head_stride, dv_row_stride, head_dim, t0, n, f.seq_k,
                      outside, tid, threads);
  }

  static BwdArgs from(const FusedBwdParams& p) {
    return BwdArgs{
        .f = FwdArgs::from(p.fwd),
        .dout = static_cast<const std::uint16_t*>(p.dout),
        .do_batch_stride = p.do_batch_stride,
        .do_head_stride = p.do_head_stride,
        .do_row_stride = p.do_row_stride,
        .dq = static_cast<std::uint16_t*>(p.dq),
        .dk = static_cast<std::uint16_t*>(p.dk),
        .dv = static_cast<std::uint16_t*>(p.dv),
        .dq_batch_stride = p.dq_batch_stride,
        .dq_head_stride = p.dq_head_stride,
        .dq_row_stride = p.dq_row_stride,
        .dk_batch_stride = p.dk_batch_stride,
        .dk_head_stride = p.dk_head_stride,
        .dk_row_stride = p.dk_row_stride,
        .dv_batch_stride = p.dv_batch_stride,
        .dv_head_stride = p.dv_head_stride,
        .dv_row_stride = p.dv_row_stride,
        .dsum = p.dsum,
        .lse_log2 = p.lse_log2,
        .dq_accum = p.dq_accum,
        .dq_semaphore = p.dq_semaphore,
        .scale = p.fwd.scale,
        .head_dim = p.fwd.head_dim,
        .rows_pad = static_cast<int>(bwd_padded_rows(p.fwd.seq_q)),
        .dq_accum_cols = p.dq_accum_cols,
        .deterministic = p.deterministic,
        .group_split = p.group_split,
        .dkv_partial = p.dkv_partial,
    };
  }
};

// A saved LSE (natural log) in log2 units; a fully masked row (+inf, or -inf,
// NaN) as +inf, so that P = 2^(s - inf) = 0 throughout.
__device__ __forceinline__ float lse_log2(float lse) { return isfinite(lse) ? lse * 1.4426950408889634f : INFINITY; }

// The workspace rows of a sequence of seq_q query rows that the backward
// reads: its query tiles, whole (rows past them, in a packed batch's shorter
// sequences, are never read: no D, LSE or accumulator to write there).
__device__ __forceinline__ int bwd_rows_read(int seq_q, int rows_pad) {
  return min((seq_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad, rows_pad);
}

// The preprocess's and the dQ conversion's grid: x the row blocks of one
// (batch, head)'s padded rows, y the (batch, head) pairs, strided past
// 65535. A block whose rows start past its sequence's rows_read does
// nothing, so a packed batch costs its own rows, not batch x its longest.
inline dim3 bwd_rows_grid(const BwdArgs& a, std::int64_t x_blocks) {
  const int bh = a.f.batch * a.f.heads;
  return dim3(static_cast<unsigned>(x_blocks), static_cast<unsigned>(bh < 65535 ? bh : 65535));
}

}  // namespace attnprof::cuda::kernels
