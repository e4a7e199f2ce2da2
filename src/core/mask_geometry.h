// Which keys a query row sees: the one definition of the mask geometry, read
// by the problem's counts (problem.cpp), the CPU kernels, the composites, the
// CUDA argument builders and kernels, the decode planner and the cuDNN graph,
// as FlashAttention-3's seqlen.h and block.h serve all of its kernels.
//
// A structural mask is a band around a diagonal: query row i of a sequence of
// seq_q queries and seq_k keys sees key j when
//   (no lower bound or j > i + hi - width) and (no upper bound or j <= i + hi),
// with hi the diagonal's offset (0 top-left, seq_k - seq_q bottom-right) and
// width a sliding window's keys. A packed batch, or a dense one
// with its own key count per sequence, applies the band of each sequence's
// own lengths.
//
// No dependencies beyond mask.h, and every function constexpr and usable on
// both sides of nvcc (ATTNPROF_HD), so that a kernel header can include it and
// a mask decided at compile time folds its branches away. Templated on the
// integer type: int64 on the host, int in kernels (int32 lengths).
#pragma once

#include <cstdint>

#include "attnprof/mask.h"

#if defined(__CUDACC__)
#define ATTNPROF_HD __host__ __device__
#else
#define ATTNPROF_HD
#endif

namespace attnprof::geometry {

// Structural: the mask follows from positions and lengths alone (none,
// causal either way, sliding window), so a kernel computes it rather than
// reading a tensor as Boolean and Bias do. Only these run on packed batches,
// in the fused kernels and on the decode paths.
ATTNPROF_HD constexpr bool structural(MaskKind m) {
  return m == MaskKind::None || m == MaskKind::Causal || m == MaskKind::CausalBottomRight ||
         m == MaskKind::SlidingWindow;
}

// A structural mask that hides some keys: its band has a bound (every
// structural mask but None). The math path rebuilds these every call.
ATTNPROF_HD constexpr bool banded(MaskKind m) { return structural(m) && m != MaskKind::None; }

// The bottom-right diagonal's key offset: the last query sees the last key.
template <class T>
ATTNPROF_HD constexpr T bottom_right_offset(T seq_q, T seq_k) {
  return seq_k - seq_q;
}

// Whether the mask's diagonal is the top-left one (PyTorch's is_causal):
// Causal alone; every other mask's is the bottom-right one.
ATTNPROF_HD constexpr bool top_left(MaskKind m) { return m == MaskKind::Causal; }

// A banded mask on the bottom-right diagonal (CausalBottomRight, SlidingWindow).
ATTNPROF_HD constexpr bool bottom_right(MaskKind m) { return banded(m) && !top_left(m); }

// The offset of the diagonal the mask's upper bound lies on (unused where
// there is no bound).
template <class T>
ATTNPROF_HD constexpr T diagonal_offset(MaskKind m, T seq_q, T seq_k) {
  return top_left(m) ? T{0} : bottom_right_offset(seq_q, seq_k);
}

// A sliding window's keys, at most seq_k (and at least 1): a window of seq_k
// keys or more already reaches before key 0 from every row (its lower bound
// is <= i + 1 - seq_q), so the clamp gives the same band for every window in
// 1..INT64_MAX while keeping the band's arithmetic inside T (int32 lengths on
// the GPU). A packed batch clamps to its longest sequence's keys.
template <class T>
ATTNPROF_HD constexpr T clamp_window(std::int64_t window, T seq_k) {
  const std::int64_t most = seq_k > 1 ? static_cast<std::int64_t>(seq_k) : 1;
  return static_cast<T>(window < most ? window : most);
}

// The band of visible keys relative to the row (see the top). The lower
// bound is kept as the window's width rather than as an offset, so that each
// function below spells its bounds as the kernels always had them (m0 + hi -
// width + 1) and the kernels keep their instructions.
template <class T>
struct Band {
  bool has_lo = false, has_hi = false;
  T hi = 0;     // the upper bound: j <= i + hi
  T width = 0;  // the lower bound (has_lo): j > i + hi - width
  // The lower bound as an offset: j >= i + lo().
  ATTNPROF_HD constexpr T lo() const { return hi - width + 1; }
};

// The band of a sequence of seq_q queries and seq_k keys under mask m (and
// window, read under SlidingWindow only); no bound for None and the tensor
// masks.
template <class T>
ATTNPROF_HD constexpr Band<T> band_of(MaskKind m, std::int64_t window, T seq_q, T seq_k) {
  const T off = diagonal_offset(m, seq_q, seq_k);
  switch (m) {
    case MaskKind::Causal:
    case MaskKind::CausalBottomRight:
      return {.has_hi = true, .hi = off};
    case MaskKind::SlidingWindow:
      return {.has_lo = true, .has_hi = true, .hi = off, .width = clamp_window(window, seq_k)};
    default:
      return {};
  }
}

template <class T>
ATTNPROF_HD constexpr bool visible(const Band<T>& b, T i, T j) {
  return (!b.has_lo || j > i + b.hi - b.width) && (!b.has_hi || j <= i + b.hi);
}

template <class T>
ATTNPROF_HD constexpr T min_of(T a, T b) {
  return b < a ? b : a;
}
template <class T>
ATTNPROF_HD constexpr T max_of(T a, T b) {
  return a < b ? b : a;
}

// A half-open range of keys (or of blocks, rows): empty when end <= begin.
template <class T>
struct Span {
  T begin, end;
  ATTNPROF_HD constexpr bool empty() const { return end <= begin; }
  ATTNPROF_HD constexpr T size() const { return end > begin ? end - begin : T{0}; }
};

// The keys of [0, seq_k) that some row of [row0, row_end) sees: the first
// row's first key to the last row's last (each row's keys are one range, and
// the next row's range starts and ends no earlier). Empty when no row sees one.
template <class T>
ATTNPROF_HD constexpr Span<T> keys_of_rows(const Band<T>& b, T row0, T row_end, T seq_k) {
  Span<T> s{T{0}, seq_k};
  if (b.has_hi) s.end = min_of(s.end, row_end + b.hi);  // (row_end - 1) + hi + 1
  if (b.has_lo) s.begin = max_of(T{0}, row0 + b.hi - b.width + 1);
  return s;
}

// Row i's visible keys.
template <class T>
ATTNPROF_HD constexpr Span<T> keys_of_row(const Band<T>& b, T i, T seq_k) {
  return keys_of_rows(b, i, i + 1, seq_k);
}

// The rows of [0, seq_q) that see some key of [key0, key_end): the backward's
// view from a block of keys. Empty when none does.
template <class T>
ATTNPROF_HD constexpr Span<T> rows_of_keys(const Band<T>& b, T key0, T key_end, T seq_q) {
  Span<T> s{T{0}, seq_q};
  if (b.has_hi) s.begin = max_of(s.begin, key0 - b.hi);
  if (b.has_lo) s.end = min_of(s.end, key_end - 1 - b.hi + b.width);  // the last key's last row, + 1
  return s;
}

// One sequence of a dense batch given by its rows (Inputs::q_rows and
// kv_rows, FlashAttention's unpadding without its copies): its queries are
// rows q.begin .. q.end - 1 of Q (and O, dO, dQ), its keys rows k.begin ..
// k.end - 1 of K and V (and dK, dV). It is the problem of its own rows: q_len
// queries, k_len keys, the band applied in its own coordinates (i - q.begin,
// j - k.begin), so a bottom-right mask aligns its last query row with its last
// key row and top-left causal aligns q.begin with k.begin. Every other row
// is outside it (zeros in O and in the gradients).
template <class T>
struct SequenceRows {
  Span<T> q, k;
  ATTNPROF_HD constexpr T q_len() const { return q.size(); }
  ATTNPROF_HD constexpr T k_len() const { return k.size(); }
  ATTNPROF_HD constexpr Band<T> band(MaskKind m, std::int64_t window) const {
    return band_of(m, window, q_len(), k_len());
  }
  // Whether tensor row i sees tensor key j under `b` (this sequence's band).
  ATTNPROF_HD constexpr bool sees(const Band<T>& b, T i, T j) const {
    return i >= q.begin && i < q.end && j >= k.begin && j < k.end && visible(b, i - q.begin, j - k.begin);
  }
};

// One sequence's rows read from a layout's index array, whatever it holds:
// clamped into the tensors (no kernel reads or writes outside them), and
// whether the array said exactly that. The one reading of the index arrays:
// flash's forward, backward and decode kernels (FwdArgs::sequence,
// decode_sequence) and cuDNN's ragged offsets make it on the device, in
// stream order; the host's check of rows it is handed (core/rows.cpp) makes
// it too, and refuses what the kernels would clamp.
template <class T>
struct ClampedRows {
  Span<T> rows;
  bool exact;  // nothing was clamped
};

// Sequence b of a packed batch of `batch` sequences from its cumulative
// lengths cu[0 .. batch]: rows cu[b] .. cu[b + 1] - 1 clamped into
// 0 <= begin <= end <= rows, at most `longest` of them (the grid covers that
// many). Not exact when anything was clamped, or when the lengths do not
// start at 0 (sequence 0) or end at the rows (the last sequence): rows no
// sequence covers are not written.
template <class T, class I>
ATTNPROF_HD constexpr ClampedRows<T> packed_rows(const I* cu, T b, T batch, T rows, T longest) {
  const T given_begin = static_cast<T>(cu[b]), given_end = static_cast<T>(cu[b + 1]);
  const T begin = min_of(max_of(given_begin, T{0}), rows);
  const T end = min_of(max_of(given_end, begin), min_of(rows, begin + longest));
  return {{begin, end},
          begin == given_begin && end == given_end && (b != 0 || given_begin == 0) &&
              (b != batch - 1 || given_end == rows)};
}

// A dense batch's sequence rows (Inputs::q_rows, kv_rows) from its entry:
// a (begin, end) pair (width 2) or an end alone (width 1: begin 0, a paged
// call's seq_lens), clamped into 0 <= begin <= end <= rows.
template <class T, class I>
ATTNPROF_HD constexpr ClampedRows<T> span_rows(const I* entry, int width, T rows) {
  const T given_begin = width == 2 ? static_cast<T>(entry[0]) : T{0}, given_end = static_cast<T>(entry[width - 1]);
  const T begin = min_of(max_of(given_begin, T{0}), rows);
  const T end = min_of(max_of(given_end, begin), rows);
  return {{begin, end}, begin == given_begin && end == given_end};
}

// Whether the block of rows [row0, row_end) and keys [key0, key_end) has a
// masked pair inside the band's bounds (the first row's upper bound or the
// last row's lower bound cuts it): only such blocks mask per element. Keys
// past seq_k are the caller's (tails).
template <class T>
ATTNPROF_HD constexpr bool block_cut_by_band(const Band<T>& b, T row0, T row_end, T key0, T key_end) {
  return (b.has_hi && key_end - 1 > row0 + b.hi) || (b.has_lo && key0 <= row_end - 1 + b.hi - b.width);
}

}  // namespace attnprof::geometry
