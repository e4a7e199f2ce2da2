// The float64 reference and the acceptance rule of DESIGN.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"

namespace attnprof {

// Fresh random inputs on the CPU (never zeros): uniform in [-1, 1) rounded to
// the dtype, in the given layout. `bshd` lays the buffers out as
// [batch, seq, heads, head_dim] and returns [B, H, S, D] views of them. A
// packed batch (p.varlen()) is always laid out as FlashAttention's varlen
// functions take it, [total, H, D], viewed as p.q_dims() and p.kv_dims().
Inputs make_inputs(const Problem& p, std::uint64_t seed, Allocator& allocator, bool bshd = false);

// With p.kv_cache == Paged, also the paged copies of K and V and their block
// table (Inputs): the physical pages a random (seeded) permutation, so a
// backend that ignores the table reads the wrong keys.
// An FP8 problem's inputs are those of fp8_real_problem(p) quantized by
// quantize_inputs() with automatic descales.

// ---- FP8 inputs ----------------------------------------------------------------

// The problem whose inputs an FP8 problem quantizes: p in bf16 (an FP8 run
// and a bf16 run of one shape and seed see the same real values), p itself
// when it is not FP8.
Problem fp8_real_problem(const Problem& p);

// One tensor's quantization to e4m3: the descale used, the largest |real|
// value, and how many of its values passed 448 x descale (e4m3's largest)
// and were saturated to +-448.
struct Fp8TensorQuantization {
  std::string name;  // "q", "k" or "v"
  double descale = 1;
  double amax = 0;
  std::int64_t saturated = 0;
  std::int64_t elements = 0;
};

struct Fp8Quantized {
  Inputs in;                                   // e4m3 q, k, v (and pages) with their descales
  std::vector<Fp8TensorQuantization> tensors;  // q, k, v
};

// The descale automatic scaling picks for a tensor whose largest |value| is
// amax: amax / 448, so the largest maps to e4m3's largest finite value; 1 for
// an all-zero tensor.
double auto_fp8_descale(double amax);

// `real` (a problem's inputs in a float dtype: make_inputs(fp8_real_problem(p)))
// quantized for the FP8 problem p: per tensor stored = e4m3(real / descale),
// rounded to nearest even and saturating, with descale `fixed` for each of q,
// k and v, or auto_fp8_descale() of each one's amax when unset. The layout is
// kept (a [B, S, H, D] view stays one); a paged cache's pages are quantized
// with their tensor's descale; the mask, bias, block table and key counts
// are shared. Throws Error(InvalidArgument) naming fp8_descale for a fixed
// descale that is zero, negative or not finite.
Fp8Quantized quantize_inputs(const Problem& p, const Inputs& real, std::optional<double> fixed, Allocator& allocator);

// Throws Error(InvalidArgument), one line naming `field`, unless `descale`
// is finite and positive.
void check_fp8_descale(std::string_view field, double descale);

// Throws Error(InvalidArgument) with one line unless `block_table` is an int32
// [1, 1, p.batch, p.pages_per_seq()] table whose every entry is a physical page in
// [0, num_pages) and no page serves two (sequence, logical page) slots.
void check_block_table(const Problem& p, const Tensor& block_table, std::int64_t num_pages);
// A caller's block table (Python's block_table=), checked for what the
// backends read of it: int32 [1, 1, p.batch, at least p.pages_per_seq()] on
// the CPU, and for each sequence b the entries of the pages that hold its
// keys kv_rows[2 b] .. kv_rows[2 b + 1] - 1 (pairs (begin, end), as
// Inputs::kv_rows holds them; every sequence keys 0 .. p.kv_seq - 1 when
// kv_rows is null) physical pages in [0, num_pages). Pages may be shared
// (a prefix cache's) and the columns outside a sequence's pages are not read,
// so neither is checked. One-line Error(InvalidArgument) otherwise.
void check_block_table_reads(const Problem& p, const Tensor& block_table, std::int64_t num_pages,
                             const std::int32_t* kv_rows);

// Which (batch, head, query row) triples to check: all of them for small
// problems, an even sample of at most `max_rows` otherwise.
struct RowSample {
  // flattened b * H * S + h * S + i; for a packed batch S is the maximum,
  // seq, and only rows i < seq_len(b) are sampled
  std::vector<std::int64_t> rows;
};
RowSample sample_rows(const Problem& p, std::int64_t max_rows);

// Where the inputs hold NaN or inf, the reference's output may too (NaN
// propagates as in PyTorch's SDPA); an output element the same there is
// expected, not an error. rel is NaN, never a small number, whenever the
// output has a non-finite element the reference lacks on a row it defines
// (not a fully masked one), or a finite one where the reference has NaN/inf.
struct ErrorStats {
  double max_abs = 0;
  double rel = 0;                          // ||out - ref|| / ||ref|| over checked finite rows; NaN as above
  std::int64_t nan_count = 0;              // non-finite output elements the reference lacks, among the checked rows
  std::int64_t nan_rows = 0;               // checked rows with any such element
  std::int64_t nan_rows_fully_masked = 0;  // of those, rows whose every key is masked
  std::int64_t nonfinite_expected = 0;     // output elements NaN or inf where the reference is the same
  std::int64_t nonfinite_hidden = 0;       // finite output elements where the reference is NaN or inf
  std::int64_t rows_checked = 0;
};

// Compares a CPU [B, H, S, D] output (p.q_dims(): packed for a packed batch,
// each sequence against its own keys) with the float64 reference on the sampled
// rows. A fully masked row's reference is zeros (the NaN-safe convention).
// The reference reads `in` as the real values: e4m3 tensors times their
// descales. An FP8 run is checked against its real (bf16) inputs instead, so
// that its error includes what quantizing them costs.
ErrorStats check_against_reference(const Problem& p, const Inputs& in, const Tensor& out, const RowSample& rows);

// ---- Gradients (the backward pass) ----------------------------------------

// A random upstream gradient dO, [B, H, S, D] in the problem's dtype, uniform
// in [-1, 1) like the inputs (a different stream of the same generator).
Tensor make_dout(const Problem& p, std::uint64_t seed, Allocator& allocator);

// Key/value rows to check dK and dV on, flattened b * Hkv * Skv + hk * Skv + j
// (Skv the maximum kv_seq of a packed batch, j < kv_seq_len(b)):
// every row of small problems; otherwise rows spread over at most a few
// (batch, kv head) pairs (each pair costs a pass over all its query rows),
// always with each pair's first and last key (the causal edges).
RowSample sample_kv_rows(const Problem& p, std::int64_t max_rows);

// Gradients (backend.h): here on the CPU, in any float dtype.
struct GradientErrors {
  ErrorStats dq, dk, dv;
};

// Compares gradients of O = softmax(scale Q K^T + mask) V against float64 for
// the upstream gradient `dout`: dQ on the sampled query rows, dK and dV on the
// sampled key rows (summed over the query heads of a grouped-query group).
// A fully masked query row has zero gradients; a key no query sees, too.
GradientErrors check_gradients_against_reference(const Problem& p, const Inputs& in, const Tensor& dout,
                                                 const Gradients& g, const RowSample& q_rows, const RowSample& kv_rows);

// DESIGN.md: 16-bit passes at <= 2 * math's error + floor; FP32 far under 1e-4;
// NaN never, except rows a backend documents (naive on fully masked rows).
// FP8 (against the real inputs' float64 output) as 16-bit does, with math in
// FP8 semantics (dequantized inputs, FP32 compute) its yardstick, and the floor
// tolerance_floor(F8E4M3) explains.
struct Acceptance {
  bool pass = false;
  double tolerance = 0;
  std::string why;  // "rel 3.1e-03 <= 2 x 1.5e-03 + 1e-03"
};
Acceptance accept(DType dtype, const ErrorStats& e, std::optional<double> math_rel, bool nan_allowed_on_masked_rows);

// Relative-error floor and FP32 bound used by accept().
double tolerance_floor(DType dtype);

}  // namespace attnprof
