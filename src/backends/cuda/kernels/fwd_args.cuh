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
#include "backends/cuda/kernels/utils.cuh"
#include "core/mask_geometry.h"

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
  // Sequences of their own lengths (FusedParams): a packed batch's
  // cumulative lengths (device int32 [batch + 1], or null: dense), and a
  // dense batch's query and key rows (FusedParams::q_rows, kv_rows: device
  // int32 [batch][2] (begin, end), or null: every row). seq_q and seq_k are
  // then the longest sequence's (a dense batch's: the tensors'); sequence(b)
  // reads sequence b's.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  const int* q_spans;
  const int* kv_spans;
  int kv_span_width;                               // FusedParams::kv_rows_width: 2 (begin, end) pairs, 1 ends alone
  std::int64_t lse_batch_stride, lse_head_stride;  // the LSE's layout ([B, H, seq_q], or packed [1, H, total_q])
  // Soft-capping: scores become tanh(s softcap_in) before the mask, and
  // scale_log2 is then softcap * log2(e) (tanh(s scale / c) c in log2
  // units); 0 without a cap.
  float softcap_in;
  int q_rows, k_rows, map_batch;  // the tensors' rows per batch and batches (the TMA maps): packed total_q, total_k, 1
  int q_row0, k_row0;             // sequence(b): its first query and key row in the tensors (0 dense)
  bool bottom_right;              // diag_offset is seq_k - seq_q (of each sequence) rather than 0
  // The device's input-error word (FusedParams::input_errors), or null: a
  // packed batch's clamped cumulative lengths OR in kInputBadCuSeqlens.
  unsigned* input_errors;
  // FP8 (fp8_fwd_args): the descales as device floats, or null (FusedParams::
  // q_descale_device ...): read by the kernel itself (fp8_scale_log2,
  // fp8_o_scale), on the launch's stream, never on the host.
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;

  // The FP8 kernel's scale: scale_log2 (the host's descales in it) times the
  // device descales, their product first as the host takes it (fp8_fwd_args),
  // so a device descale gives the bits its float would.
  __device__ __forceinline__ float fp8_scale_log2() const {
    if (q_descale == nullptr && k_descale == nullptr) return scale_log2;
    return scale_log2 * ((q_descale != nullptr ? *q_descale : 1.f) * (k_descale != nullptr ? *k_descale : 1.f));
  }
  // O's factor: V's descale, the host's (`host`, Params::o_scale) or the device's.
  __device__ __forceinline__ float fp8_o_scale(float host) const { return v_descale != nullptr ? *v_descale : host; }

  // Whether sequences differ in length (a packed batch, or a dense batch's rows).
  __host__ __device__ __forceinline__ bool per_sequence() const {
    return cu_seqlens_q != nullptr || q_spans != nullptr || kv_spans != nullptr;
  }

  // Sequence b as a problem of its own: its lengths and mask diagonal, and
  // the tensors' addresses of its first rows (packed, or a dense batch's
  // rows), so that everything indexing by batch, head and row reads its
  // rows; itself when dense. A dense batch's rows are clamped into the
  // tensors here, on the device (whatever the caller's tensors hold, no
  // kernel reads outside Q, K or V).
  __device__ __forceinline__ FwdArgs sequence(int b) const {
    FwdArgs s = *this;
    if (!per_sequence()) return s;
    geometry::Span<int> q{0, q_rows}, k{0, k_rows};
    if (cu_seqlens_q != nullptr) {
      const auto qc = geometry::packed_rows(cu_seqlens_q, b, batch, q_rows, seq_q);
      const auto kc = geometry::packed_rows(cu_seqlens_k, b, batch, k_rows, seq_k);
      q = qc.rows;
      k = kc.rows;
      if (!(qc.exact && kc.exact) && input_errors != nullptr && threadIdx.x == 0) {
        atomicOr(input_errors, kInputBadCuSeqlens);
      }
    } else {
      if (q_spans != nullptr) q = geometry::span_rows(q_spans + 2 * b, 2, q_rows).rows;
      if (kv_spans != nullptr) k = geometry::span_rows(kv_spans + kv_span_width * b, kv_span_width, k_rows).rows;
    }
    const int q0 = q.begin, k0 = k.begin;
    s.seq_q = q.size();
    s.seq_k = k.size();
    s.q += q0 * q_row_stride;
    s.o += q0 * o_row_stride;
    s.k += k0 * k_row_stride;
    s.v += k0 * v_row_stride;
    if (lse != nullptr) s.lse += q0;
    s.q_row0 = q0;
    s.k_row0 = k0;
    if (bottom_right) s.diag_offset = geometry::bottom_right_offset(s.seq_q, s.seq_k);
    return s;
  }
  // Whether row `row` of this sequence's tensors (Q and O: its query rows;
  // K and V: its keys) lies outside the sequence, which a dense batch's rows
  // (q_spans, kv_spans) leave to be written as zeros: a tile of the tensor
  // zeroes its rows that do (zero_rows_outside).
  __device__ __forceinline__ bool q_row_outside(int row) const { return row < q_row0 || row >= q_row0 + seq_q; }
  __device__ __forceinline__ bool k_row_outside(int row) const { return row < k_row0 || row >= k_row0 + seq_k; }
  // The batch coordinate of sequence b in the TMA maps (a packed batch is one).
  __device__ __forceinline__ int map_batch_of(int b) const { return cu_seqlens_q != nullptr ? 0 : b; }

  static FwdArgs from(const FusedParams& p) {
    const bool top_left = geometry::top_left(p.mask);
    const bool packed = p.cu_seqlens_q != nullptr;
    const float log2e = 1.4426950408889634f;
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
        .scale_log2 = p.softcap > 0.f ? p.softcap * log2e : p.scale * log2e,
        .diag_offset = geometry::diagonal_offset(p.mask, p.seq_q, p.seq_k),
        .window = p.window,  // clamped to the keys (params_for): int arithmetic below cannot overflow
        .lse = p.lse,
        .cu_seqlens_q = p.cu_seqlens_q,
        .cu_seqlens_k = p.cu_seqlens_k,
        .q_spans = p.q_rows,
        .kv_spans = p.kv_rows,
        .kv_span_width = p.kv_rows_width,
        .lse_batch_stride = packed ? 0 : static_cast<std::int64_t>(p.heads) * p.seq_q,
        .lse_head_stride = packed ? p.total_q : p.seq_q,
        .softcap_in = p.softcap > 0.f ? p.scale / p.softcap : 0.f,
        .q_rows = packed ? p.total_q : p.seq_q,
        .k_rows = packed ? p.total_k : p.seq_k,
        .map_batch = packed ? 1 : p.batch,
        .q_row0 = 0,
        .k_row0 = 0,
        .bottom_right = !top_left,
        .input_errors = p.input_errors,
        .q_descale = nullptr,
        .k_descale = nullptr,
        .v_descale = nullptr,
    };
  }
};

// Key tiles [begin, end) that rows [m0, m0 + kBlockM) can see; empty when the
// whole query tile is masked (its rows are then written as zeros).
// flash's FP8 forward's arguments (flash_fwd_sm90_fp8.cuh): Q's and K's descales in the
// softmax scale, V^T (p.v_t, fp8_vt_cols keys a row) as V.
inline FwdArgs fp8_fwd_args(const FusedParams& p) {
  FwdArgs a = FwdArgs::from(p);
  a.scale_log2 *= p.q_descale * p.k_descale;
  a.q_descale = p.q_descale_device;
  a.k_descale = p.k_descale_device;
  a.v_descale = p.v_descale_device;
  a.v = static_cast<const std::uint16_t*>(p.v_t);  // bytes, as q and k are
  a.v_row_stride = fp8_vt_cols(p.seq_k);
  a.v_head_stride = static_cast<std::int64_t>(p.head_dim) * a.v_row_stride;
  a.v_batch_stride = static_cast<std::int64_t>(p.kv_heads) * a.v_head_stride;
  return a;
}

struct KeyTiles {
  int begin, end;
};

// The band (core/mask_geometry.h) of a sequence's arguments under a mask
// mode fixed at compile time: which bounds it has folds away, leaving the
// arithmetic on diag_offset and window that the kernels spelled out before
// (on sm80 the same PTX instructions as the hand-written form, at most
// reordered in the tile range's prologue).
template <MaskMode kMask>
__host__ __device__ __forceinline__ geometry::Band<int> band_of(const FwdArgs& a) {
  return {
      .has_lo = kMask == MaskMode::Window, .has_hi = kMask != MaskMode::None, .hi = a.diag_offset, .width = a.window};
}

template <MaskMode kMask, int kBlockM, int kBlockN>
__device__ __forceinline__ KeyTiles key_tiles(const FwdArgs& a, int m0) {
  if (m0 >= a.seq_q) return {0, 0};  // past a shorter sequence's rows (packed batches)
  const geometry::Span<int> keys = geometry::keys_of_rows(band_of<kMask>(a), m0, m0 + kBlockM, a.seq_k);
  if (keys.empty()) return {0, 0};
  return {keys.begin / kBlockN, (keys.end + kBlockN - 1) / kBlockN};
}

// The backward's view from a key tile: query tiles [begin, end) of kBlockM
// rows that see some key of the kBlockN keys at n0 (empty when none does).
struct QueryTiles {
  int begin, end;
};

template <MaskMode kMask, int kBlockM, int kBlockN>
__device__ __forceinline__ QueryTiles query_tiles(const FwdArgs& f, int n0) {
  if (n0 >= f.seq_k) return {0, 0};  // past a shorter sequence's keys
  const geometry::Span<int> rows = geometry::rows_of_keys(band_of<kMask>(f), n0, n0 + kBlockN, f.seq_q);
  if (rows.empty()) return {0, 0};
  return {rows.begin / kBlockM, (rows.end + kBlockM - 1) / kBlockM};
}

// True when some (row, key) pair of this tile is masked: the key tail past
// seq_k, keys past the first row's diagonal, or keys before the last row's
// window. Every other tile runs without per-element work.
template <MaskMode kMask, int kBlockM, int kBlockN>
__device__ __forceinline__ bool tile_needs_mask(const FwdArgs& a, int m0, int n0) {
  bool need = n0 + kBlockN > a.seq_k;
  need |= geometry::block_cut_by_band(band_of<kMask>(a), m0, m0 + kBlockM, n0, n0 + kBlockN);
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
      // The row's band, kept open below (no clamp at key 0: col0 >= 0).
      const geometry::Band<int> band = band_of<kMask>(a);
      int hi = a.seq_k - col0;  // visible: lo < col - col0 < hi
      if (band.has_hi) hi = min(hi, row + band.hi + 1 - col0);
      int lo = -1;
      if (band.has_lo) lo = row + band.hi - band.width - col0;
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

// The rows [t0, t0 + n) of one (batch, head) of a tensor (`base` its row 0;
// T 16-bit or float, `cols` elements a row, rows 16-byte aligned), clipped
// to `rows`, that lie `outside(row)` a dense batch's sequence
// (FwdArgs::q_row_outside, k_row_outside), written as zeros, 16 bytes a
// store by `threads` threads from `tid`. Every row of the tensor is in one
// tile of its kernel's grid, and that tile writes its zeros in the same
// kernel (no memset), whichever of the sequence's tiles (if any) it computes.
template <class T, class Outside>
__device__ __forceinline__ void zero_rows_outside(T* base, std::int64_t row_stride, int cols, int t0, int n, int rows,
                                                  Outside outside, int tid, int threads) {
  constexpr int kPerStore = 16 / static_cast<int>(sizeof(T));
  const int chunks = cols / kPerStore;
  for (int e = tid; e < n * chunks; e += threads) {
    const int row = t0 + e / chunks;
    if (row < rows && outside(row)) {
      *reinterpret_cast<uint4*>(base + row * row_stride + (e % chunks) * kPerStore) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Soft-capping's first half, on raw scores before the mask: s = tanh(s
// softcap_in); the softmax's scale_log2 (softcap log2(e)) makes the rest.
template <int kRows, int kCols>
__device__ __forceinline__ void softcap_scores(float (&s)[kRows][kCols], float softcap_in) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) s[r][c] = tanh_approx(s[r][c] * softcap_in);
  }
}

}  // namespace attnprof::cuda::kernels
