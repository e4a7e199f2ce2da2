// Device-side arguments of the fused attention forwards, made from the
// host-side FusedParams in one place (FwdArgs::from), and the mask geometry
// they share: which key tiles a query tile must visit (and, for the backward,
// which query tiles a key tile meets), which of those need
// per-element masking, and the per-element rule itself. (Where a CTA's tile
// sits: tile_scheduler.cuh.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnprof/mask.h"
#include "backends/cuda/fused_params.h"

namespace attnprof::cuda::kernels {

// The kernels' template parameter for the problem's mask (MaskKind,
// attnprof/mask.h): Causal covers both alignments (top-left is diag_offset 0,
// bottom-right is diag_offset = seq_k - seq_q, FwdArgs::from); Window is
// bottom-right causal plus a lower bound.
enum class MaskMode : int { None, Causal, Window };

// The one mapping of MaskKind to MaskMode: f.template operator()<kMask>() at
// the MaskMode of `mask`; `otherwise` for the masks given as tensors (Boolean,
// Bias), which no fused kernel reads (fused_unsupported_reason refuses them).
template <class R, class F>
constexpr R with_mask_mode(MaskKind mask, R otherwise, F&& f) {
  switch (mask) {
    case MaskKind::None:
      return f.template operator()<MaskMode::None>();
    case MaskKind::Causal:
    case MaskKind::CausalBottomRight:
      return f.template operator()<MaskMode::Causal>();
    case MaskKind::SlidingWindow:
      return f.template operator()<MaskMode::Window>();
    case MaskKind::Boolean:
    case MaskKind::Bias:
      break;
  }
  return otherwise;
}

// The same as a value, for a kernel that takes the mask at run time (decode).
constexpr MaskMode mask_mode(MaskKind mask) {
  // [&]: no conversion to a function pointer for nvcc to warn about.
  return with_mask_mode(mask, MaskMode::None, [&]<MaskMode kMask>() { return kMask; });
}

struct FwdArgs {
  const std::uint16_t* q;
  const std::uint16_t* k;
  const std::uint16_t* v;
  std::uint16_t* o;
  std::int64_t q_batch_stride, q_head_stride, q_row_stride;
  std::int64_t k_batch_stride, k_head_stride, k_row_stride;
  std::int64_t v_batch_stride, v_head_stride, v_row_stride;
  std::int64_t o_batch_stride, o_head_stride, o_row_stride;
  int batch, heads, group, seq_q, seq_k;
  float scale_log2;  // softmax scale * log2(e): scores go through exp2
  int diag_offset;   // query i sees keys j <= i + diag_offset (Causal, Window)
  int window;        // Window: and keys j > i + diag_offset - window
  float* lse;        // [B, H, seq_q] or null (FusedParams::lse); last, so the other fields keep their offsets

  static FwdArgs from(const FusedParams& p) {
    const bool top_left = p.mask == MaskKind::Causal;
    return FwdArgs{
        .q = static_cast<const std::uint16_t*>(p.q),
        .k = static_cast<const std::uint16_t*>(p.k),
        .v = static_cast<const std::uint16_t*>(p.v),
        .o = static_cast<std::uint16_t*>(p.o),
        .q_batch_stride = p.q_batch_stride,
        .q_head_stride = p.q_head_stride,
        .q_row_stride = p.q_row_stride,
        .k_batch_stride = p.k_batch_stride,
        .k_head_stride = p.k_head_stride,
        .k_row_stride = p.k_row_stride,
        .v_batch_stride = p.v_batch_stride,
        .v_head_stride = p.v_head_stride,
        .v_row_stride = p.v_row_stride,
        .o_batch_stride = p.o_batch_stride,
        .o_head_stride = p.o_head_stride,
        .o_row_stride = p.o_row_stride,
        .batch = p.batch,
        .heads = p.heads,
        .group = p.heads / p.kv_heads,
        .seq_q = p.seq_q,
        .seq_k = p.seq_k,
        .scale_log2 = p.scale * 1.4426950408889634f,
        .diag_offset = top_left ? 0 : p.seq_k - p.seq_q,
        .window = p.window,
        .lse = p.lse,
    };
  }
};

// Key tiles [begin, end) that rows [m0, m0 + kBlockM) can see; empty when the
// whole query tile is masked (its rows are then written as zeros).
struct KeyTiles {
  int begin, end;
};

template <MaskMode kMask, int kBlockM, int kBlockN>
__device__ __forceinline__ KeyTiles key_tiles(const FwdArgs& a, int m0) {
  int hi = a.seq_k;  // exclusive key bound
  int lo = 0;
  if constexpr (kMask != MaskMode::None) hi = min(hi, m0 + kBlockM + a.diag_offset);
  if constexpr (kMask == MaskMode::Window) lo = max(0, m0 + a.diag_offset - a.window + 1);
  if (hi <= lo) return {0, 0};
  return {lo / kBlockN, (hi + kBlockN - 1) / kBlockN};
}

// The backward's view from a key tile: query tiles [begin, end) of kBlockM
// rows that see some key of the kBlockN keys at n0 (empty when none does).
struct QueryTiles {
  int begin, end;
};

template <MaskMode kMask, int kBlockM, int kBlockN>
__device__ __forceinline__ QueryTiles query_tiles(const FwdArgs& f, int n0) {
  int lo = 0, hi = f.seq_q;
  // Row i sees key j when j <= i + off (Causal, Window) and j > i + off - window (Window).
  if constexpr (kMask != MaskMode::None) lo = max(lo, n0 - f.diag_offset);
  if constexpr (kMask == MaskMode::Window) hi = min(hi, n0 + kBlockN - 1 - f.diag_offset + f.window);
  if (hi <= lo) return {0, 0};
  return {lo / kBlockM, (hi + kBlockM - 1) / kBlockM};
}

// True when some (row, key) pair of this tile is masked: the key tail past
// seq_k, keys past the first row's diagonal, or keys before the last row's
// window. Every other tile runs without per-element work.
template <MaskMode kMask, int kBlockM, int kBlockN>
__device__ __forceinline__ bool tile_needs_mask(const FwdArgs& a, int m0, int n0) {
  bool need = n0 + kBlockN > a.seq_k;
  if constexpr (kMask != MaskMode::None) need |= n0 + kBlockN - 1 > m0 + a.diag_offset;
  if constexpr (kMask == MaskMode::Window) need |= n0 <= m0 + kBlockM - 1 + a.diag_offset - a.window;
  return need;
}

// Sets masked scores of a warp's S fragments to -inf. row0: this thread's first
// row (tile row of fragment row g); col0: this thread's first key (n0 + 2t).
// Each row's visible keys are an interval (lo, hi), computed once per row so
// that an element costs two compares (few live registers beside S and O).
template <MaskMode kMask, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTiles][4], const FwdArgs& a, int row0, int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + mt * 16 + 8 * h;
      int hi = a.seq_k - col0;  // visible: lo < col - col0 < hi
      if constexpr (kMask != MaskMode::None) hi = min(hi, row + a.diag_offset + 1 - col0);
      int lo = -1;
      if constexpr (kMask == MaskMode::Window) lo = row + a.diag_offset - a.window - col0;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = nt * 8 + e;
          if (c >= hi || c <= lo) s[mt][nt][2 * h + e] = -INFINITY;
        }
      }
    }
  }
}

}  // namespace attnprof::cuda::kernels
