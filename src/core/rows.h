// Per-sequence rows (Inputs::q_rows, Inputs::kv_rows) on the host: read and
// checked in one place, and lowered to the Boolean mask that says the same
// thing for the readers that take no rows (the float64 reference).
#pragma once

#include <cstdint>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "core/mask_geometry.h"

namespace attnprof {

using SequenceRows = geometry::SequenceRows<std::int64_t>;

// Sequence b of a call in its tensors, whatever the batch layout: the batch
// index of Q, K, V and O it lies in (0 when packed) and its query and key rows
// there. The one sequence view the CPU tiles (backends/cpu/flash_tiles.cpp), the
// composites' and the float64 reference's per-sequence loops (varlen.h's
// sequence_inputs) read; the CUDA kernels' FwdArgs::sequence(b) computes the
// same rows on the device, clamped.
struct SequenceView {
  std::int64_t tb = 0;
  SequenceRows rows;
};
// Every sequence of a call of `p`: dense, batch index b and every row; packed
// (seq_lens), batch index 0 and its rows of the cumulative lengths; padded,
// batch index b and `rows` (sequence_rows' answer; empty: not padded). An
// internal error for a packed batch whose lengths are on the device.
std::vector<SequenceView> sequence_views(const Problem& p, const std::vector<SequenceRows>& rows = {});

// Whether `in` carries per-sequence rows.
inline bool has_rows(const Inputs& in) { return in.q_rows.defined() || in.kv_rows.defined(); }

// Each sequence's rows from in.q_rows and in.kv_rows (int32 [1, 1, B, 2] on
// the CPU; an undefined one is every row), checked: dtype, shape, device,
// 0 <= begin <= end <= seq (kv_seq), and that p takes rows at all (a dense
// batch, no tensor mask). One-line Error(InvalidArgument) naming the argument
// and entry otherwise ("kv_rows[3] = (5, 9000) is outside 0 .. 2048"). Empty
// when `in` has neither.
std::vector<SequenceRows> sequence_rows(const Problem& p, const Inputs& in);

// p's structural mask within each sequence's rows (SequenceRows::sees) as a
// Boolean mask, bool [B, 1, S, Skv] on the CPU: a row outside q_rows sees
// nothing.
Tensor rows_mask(const Problem& p, const std::vector<SequenceRows>& rows, Allocator& allocator);

// (p, in) with the rows lowered to that mask: p.mask Boolean (no window), in.mask
// the mask, the rows cleared. What it computes is what the rows say: a fully
// masked row's output and gradients are the zeros that rows outside q_rows
// and kv_rows get.
struct LoweredRows {
  Problem p;
  Inputs in;
};
LoweredRows lower_rows(const Problem& p, const Inputs& in, Allocator& allocator);

// Zeros rows of t ([B, H, rows, D], the CPU) outside each sequence's query
// rows (queries) or key rows (!queries).
void zero_outside_rows(const Tensor& t, const std::vector<SequenceRows>& rows, bool queries);

}  // namespace attnprof
