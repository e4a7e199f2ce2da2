// Packed (variable-length) batches: one sequence's rows of the packed tensors
// (Problem::seq_lens says how they are laid out). The per-sequence loops of
// the composites and the float64 reference run each sequence as the dense
// batch-1 problem Problem::sequence(b) on these views.
#pragma once

#include <cstdint>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof {

// Rows [first, first + n) of a packed [1, H, total, D] tensor (any strides),
// as the view [1, H, n, D]. Nothing is copied.
Tensor packed_rows(const Tensor& t, std::int64_t first, std::int64_t n);

// Sequence b of packed inputs: its Q rows and its K and V rows, as views
// shaped for p.sequence(b) ([1, H, seq_len(b), D], [1, Hkv, kv_seq_len(b), D]).
Inputs sequence_inputs(const Problem& p, const Inputs& in, std::int64_t b);

// Sequence b's query rows of a packed Q-shaped tensor (O, dO, dQ) and key
// rows of a K-shaped one (dK, dV).
Tensor sequence_q_rows(const Problem& p, const Tensor& t, std::int64_t b);
Tensor sequence_kv_rows(const Problem& p, const Tensor& t, std::int64_t b);

}  // namespace attnprof
