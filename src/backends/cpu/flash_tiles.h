// What the CPU flash forward (flash.cpp) and backward (flash_backward.cpp)
// share: the query block size, the structural mask as a band, row loads that
// widen any dtype to FP32, and the masking of one block of S^T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "core/mask_geometry.h"
#include "core/mask_lowering.h"
#include "core/rows.h"

namespace attnprof::cpu::flash {

// 64 query rows: the transposed query block (64 x D floats) stays in L1 for
// D <= 64 and in L2 up to D = 256, and 64 is 4 vector strips of 16 columns.
// Blocks of S^T are laid out with this row length.
constexpr std::int64_t kBlockQ = 64;

constexpr float kLog2e = std::numbers::log2e_v<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Lays out one thread's scratch buffers end to end, each starting on a
// 16-float (64-byte) boundary: offsets in floats, and the total.
struct ScratchLayout {
  std::int64_t total = 0;
  std::int64_t take(std::int64_t floats) {
    const std::int64_t start = total;
    total += round_up(floats, 16);
    return start;
  }
};

// ctx.threads, or every OpenMP thread when 0.
int resolve_threads(int requested);

// Why the CPU flash backend cannot run `p` (wrong device, invalid problem), or
// empty when it can.
std::string check_problem(const Problem& p);
// Throws when a Boolean or Bias problem comes without its tensor.
void require_mask_tensor(const Problem& p, const Inputs& in);

// The structural mask as a band around the diagonal: key j is visible from
// query i when (no lower bound or j >= i + lo) and (no upper bound or j <= i + hi)
// (core/mask_geometry.h, whose window is clamped to the keys).
using Band = geometry::Band<std::int64_t>;
Band band_of(const Problem& p);
// The band of one sequence of seq queries and kv_seq keys under p's mask
// (the bottom-right diagonal at kv_seq - seq).
Band band_of(const Problem& p, std::int64_t seq, std::int64_t kv_seq);

// Decoding: a sequence of at most kDecodeQueries queries, its query heads of
// one KV head together at most kDecodeRows rows, under a structural mask (or
// none). Its forward runs one item per (sequence, KV head, key range: below)
// that reads each key and value row once for all those rows
// (flash_decode_kernels.h), where the tiled kernels would pad the few rows to
// a vector's lanes or a tile's rows, and repack K and V per query head.
//
// The choice is each sequence's own, from its own query count, whether it
// runs alone, in a packed batch or as a caller's rows (q_rows): the two items
// round differently (dot products summed across a vector's lanes against FMA
// chains along the head dim, or bf16 tile products), and a sequence must give
// the same bits alone as in a batch (VarlenBackends.*BitForBit).
constexpr std::int64_t kDecodeQueries = 4;
constexpr std::int64_t kDecodeRows = 64;
bool decodes(const Problem& p, std::int64_t queries);
// Every sequence of p decodes (its longest has at most kDecodeQueries queries).
bool decodes(const Problem& p);
// Some sequence of p may decode: a packed batch's short sequences, or any
// sequence of a dense one (a caller's q_rows may leave it a few rows).
bool may_decode(const Problem& p);

// One sequence of a problem as the kernels walk it: batch b of a dense
// problem, or sequence b of a packed one (Problem::seq_lens), whose rows lie
// at an offset in the packed tensors. Each item's row and key indices are
// the sequence's own; q0 and k0 place them in the tensors.
struct Sequence {
  std::int64_t tb = 0;      // batch index into the tensors (0 when packed)
  std::int64_t q0 = 0;      // its first query row in Q, O, dO, dQ
  std::int64_t k0 = 0;      // its first key row in K, V, dK, dV
  std::int64_t seq = 0;     // its queries
  std::int64_t kv_seq = 0;  // its keys
  std::int64_t qb0 = 0;     // query blocks of the sequences before it (the backward's dQ tiles)
  Band band;
};
std::vector<Sequence> sequences_of(const Problem& p);

// A decoding sequence's visible keys, cut into ranges of kDecodeChunkKeys
// from its first visible key: one item each with its KV head, whose partial
// results are merged in key order (FlashDecoding's split, on the CPU). A long
// sequence then fills the threads whatever its batch and KV heads (batch 1
// of one KV head was one item), and the ranges are the sequence's own, so
// its bits depend neither on the batch nor on the thread count. One range
// (the whole item, no merge) where it sees at most kDecodeChunkKeys keys.
constexpr std::int64_t kDecodeChunkKeys = 512;
std::int64_t decode_chunks(const Sequence& s);
geometry::Span<std::int64_t> decode_chunk_keys(const Sequence& s, std::int64_t chunk);
// Floats of one range's partial result: each row's unnormalised O (head_dim
// floats), then each row's running max and sum, for the most rows a
// decoding sequence of p has.
std::int64_t decode_partial_floats(const Problem& p);
// A dense batch's sequences at their rows (Inputs::q_rows and kv_rows, read
// by core/rows.h's sequence_rows): each the problem of its own rows, its band
// in its own coordinates; sequences_of(p) when `rows` is empty. Its query
// blocks stay those of the batch's, so the items and dQ tiles keep their
// count and a sequence's padded query blocks return at once.
std::vector<Sequence> sequences_of(const Problem& p, const std::vector<SequenceRows>& rows);
// Zeros what a forward leaves outside the rows: O's rows outside q_rows and
// their log-sum-exp (-inf, a row that sees no key; lse null: none).
void clear_outside_rows(const Problem& p, const std::vector<SequenceRows>& rows, const Tensor& out, float* lse);
// Query blocks of all sequences together.
std::int64_t total_q_blocks(const Problem& p);
// The log-sum-exp's sizes: [B, H, S, 1], or [1, H, total_q, 1] when packed;
// row i of head h of sequence s lies at (s.tb * H + h) * lse_rows(p) + s.q0 + i.
Dims lse_dims(const Problem& p);
std::int64_t lse_rows(const Problem& p);
// Throws unless in's Q, K, V (and `out`-shaped tensors) have p's sizes:
// p.q_dims() and p.kv_dims(), packed or not.
void require_shapes(const Problem& p, const Inputs& in, const char* who);

// Row i of t[b, h] (n elements) widened to FP32 (baseline code: the drivers'
// reads; the kernels have their own, flash_forward_kernels.h), and rounded
// once from FP32 into t's dtype (the drivers' and the kernels' stores: these
// are baseline code too, so no level's instructions leak into a shared symbol).
void load_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n, float* dst);
void store_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n, const float* src);

// -inf where the band hides key j0 + j from query i0 + c, in S^T (rows lds
// floats apart), on a block that straddles a bound.
void mask_band(const Band& band, std::int64_t i0, std::int64_t j0, std::int64_t n, std::int64_t qcols, float* st,
               std::int64_t lds);

// Boolean masks (false hides) and additive biases (times log2(e): the logits
// are base 2) applied to S^T of query rows i0..i0+nq and keys j0..j0+n
// (rows lds floats apart).
void mask_tensor(const Problem& p, const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                 std::int64_t j0, std::int64_t n, float* st, std::int64_t lds);

}  // namespace attnprof::cpu::flash

namespace attnprof::cpu::flash {

// ---- The backward (flash_backward.cpp) -------------------------------------

// Bytes the backward allocates with `threads` threads: per-thread tiles, the
// FP32 dQ accumulator and each row's rowsum(dO * O).
std::size_t backward_workspace_bytes(const Problem& p, int threads);

// dQ, dK and dV from the forward's per-row log-sum-exp `lse` (FP32
// [B, H, S, 1], natural log, -inf on a fully masked row).
void backward(const Problem& p, const Inputs& in, const Tensor& out, const Tensor& dout, const Tensor& lse,
              Gradients& grads, RunContext& ctx);

}  // namespace attnprof::cpu::flash
