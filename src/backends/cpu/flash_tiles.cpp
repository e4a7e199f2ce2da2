// What flash_tiles.h declares for the CPU flash forward (flash.cpp) and backward
// (flash_backward.cpp): the thread count, the problem's checks, the structural
// mask as a band, each sequence's rows and first query block, decoding's choice,
// the log-sum-exp's sizes, baseline row loads and stores, and the masking of one
// block of S^T by the band or by a mask or bias tensor.
#include "backends/cpu/flash_tiles.h"

#include <omp.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "backends/cpu/ops.h"

namespace attnprof::cpu::flash {

int resolve_threads(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

Band band_of(const Problem& p) { return band_of(p, p.seq, p.kv_seq); }

Band band_of(const Problem& p, std::int64_t seq, std::int64_t kv_seq) {
  return geometry::band_of(p.mask, p.window, seq, kv_seq);
}

// Each sequence's rows from the one sequence view (core/rows.h:
// sequence_views, which the reference and the composites read too), its band
// at its own lengths, and its first query block.
std::vector<Sequence> sequences_of(const Problem& p, const std::vector<SequenceRows>& rows) {
  const std::vector<SequenceView> views = sequence_views(p, rows);
  std::vector<Sequence> seqs(views.size());
  std::int64_t qb0 = 0;
  for (std::size_t b = 0; b < views.size(); ++b) {
    const SequenceView& v = views[b];
    Sequence& s = seqs[b];
    s.tb = v.tb;
    s.q0 = v.rows.q.begin;
    s.k0 = v.rows.k.begin;
    s.seq = v.rows.q_len();
    s.kv_seq = v.rows.k_len();
    s.band = band_of(p, s.seq, s.kv_seq);
    // The batch's query blocks, not the rows': a padded sequence keeps its
    // items and dQ tiles (its padded blocks return at once).
    s.qb0 = qb0;
    qb0 += (p.seq_len(static_cast<std::int64_t>(b)) + kBlockQ - 1) / kBlockQ;
  }
  return seqs;
}

std::vector<Sequence> sequences_of(const Problem& p) { return sequences_of(p, {}); }

std::int64_t decode_chunks(const Sequence& s) {
  const auto keys = geometry::keys_of_rows(s.band, std::int64_t{0}, s.seq, s.kv_seq);
  return std::max<std::int64_t>(1, (keys.size() + kDecodeChunkKeys - 1) / kDecodeChunkKeys);
}

geometry::Span<std::int64_t> decode_chunk_keys(const Sequence& s, std::int64_t chunk) {
  const auto keys = geometry::keys_of_rows(s.band, std::int64_t{0}, s.seq, s.kv_seq);
  if (keys.empty()) return keys;
  const std::int64_t begin = keys.begin + chunk * kDecodeChunkKeys;
  return {begin, std::min(keys.end, begin + kDecodeChunkKeys)};
}

std::int64_t decode_partial_floats(const Problem& p) {
  const std::int64_t rows = p.group() * std::min(p.seq, kDecodeQueries);
  return rows * (p.head_dim + 2);
}

void clear_outside_rows(const Problem& p, const std::vector<SequenceRows>& rows, const Tensor& out, float* lse) {
  zero_outside_rows(out, rows, /*queries=*/true);
  if (lse == nullptr) return;
  for (std::size_t b = 0; b < rows.size(); ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      float* row = lse + (static_cast<std::int64_t>(b) * p.heads + h) * p.seq;
      std::fill(row, row + rows[b].q.begin, kNegInf);
      std::fill(row + rows[b].q.end, row + p.seq, kNegInf);
    }
  }
}

bool decodes(const Problem& p, std::int64_t queries) {
  return geometry::structural(p.mask) && queries <= kDecodeQueries && p.group() * queries <= kDecodeRows;
}

// p.seq is a packed batch's longest sequence, and bounds a caller's rows.
bool decodes(const Problem& p) { return decodes(p, p.seq); }

bool may_decode(const Problem& p) {
  if (!decodes(p, 1)) return false;
  if (!p.varlen()) return true;
  for (std::int64_t b = 0; b < p.batch; ++b)
    if (p.seq_len(b) > 0 && decodes(p, p.seq_len(b))) return true;
  return false;
}

std::int64_t total_q_blocks(const Problem& p) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) n += (p.seq_len(b) + kBlockQ - 1) / kBlockQ;
  return n;
}

Dims lse_dims(const Problem& p) {
  return p.varlen() ? Dims{1, p.heads, p.total_q(), 1} : Dims{p.batch, p.heads, p.seq, 1};
}

std::int64_t lse_rows(const Problem& p) { return p.varlen() ? p.total_q() : p.seq; }

void require_shapes(const Problem& p, const Inputs& in, const char* who) {
  const auto check = [&](const char* name, const Tensor& t, const Dims& want) {
    if (!t.defined() || t.sizes() != want) {
      fail(ErrorKind::InvalidArgument, std::string(who) + ": " + name + " must be " + dims_string(want) + " for " +
                                           p.describe() + ", got " + (t.defined() ? t.dims_string() : "none"));
    }
  };
  check("q", in.q, p.q_dims());
  check("k", in.k, p.kv_dims());
  check("v", in.v, p.kv_dims());
}

// Baseline (the drivers' row reads: the backward's rowsum(dO * O)); the
// kernels widen with their own vectors (flash_forward_kernels.h).
void load_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n, float* dst) {
  load_run_as_float(t.data(), t.dtype(), t.index(b, h, i, 0), n, t.stride(3), dst);
}

void store_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n, const float* src) {
  store_run_from_float(t.data(), t.dtype(), t.index(b, h, i, 0), n, t.stride(3), src);
}

// Per key row the visible query columns are one interval.
void mask_band(const Band& band, std::int64_t i0, std::int64_t j0, std::int64_t n, std::int64_t qcols, float* st,
               std::int64_t lds) {
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t key = j0 + j;
    const std::int64_t first = band.has_hi ? std::clamp(key - band.hi - i0, std::int64_t{0}, qcols) : 0;
    const std::int64_t end = band.has_lo ? std::clamp(key - band.lo() - i0 + 1, first, qcols) : qcols;
    float* row = st + j * lds;
    std::fill(row, row + first, kNegInf);
    std::fill(row + end, row + qcols, kNegInf);
  }
}

// A base-2 score plus a bias; a bias of -inf hides the key as a mask does,
// so a NaN or inf score there stays hidden (as in the float64 reference).
inline float biased(float s2, float bias) {
  return bias == -std::numeric_limits<float>::infinity() ? kNegInf : s2 + kLog2e * bias;
}

// Masks and biases are read row by row through the tensor's strides, so
// [1, 1, S, Skv] and stride-0 expanded views both work.
void mask_tensor(const Problem& p, const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                 std::int64_t j0, std::int64_t n, float* st, std::int64_t lds) {
  const bool boolean = p.mask == MaskKind::Boolean;
  const Tensor& t = boolean ? in.mask : in.bias;
  const std::int64_t tb = t.size(0) == 1 ? 0 : b;
  const std::int64_t th = t.size(1) == 1 ? 0 : h;
  const std::int64_t inc = t.stride(3);
  for (std::int64_t c = 0; c < nq; ++c) {
    const std::int64_t base = t.index(tb, th, i0 + c, j0);
    if (boolean) {
      const auto* keep = t.data_as<const std::uint8_t>() + base;
      for (std::int64_t j = 0; j < n; ++j)
        if (!keep[j * inc]) st[j * lds + c] = kNegInf;
    } else if (t.dtype() == DType::F32) {
      const float* bias = t.data_as<const float>() + base;
      for (std::int64_t j = 0; j < n; ++j) st[j * lds + c] = biased(st[j * lds + c], bias[j * inc]);
    } else {
      for (std::int64_t j = 0; j < n; ++j)
        st[j * lds + c] = biased(st[j * lds + c], load_as_float(t.data(), t.dtype(), base + j * inc));
    }
  }
}

std::string check_problem(const Problem& p) {
  if (p.device != Device::Cpu) return "the CPU flash backend runs on the CPU; use device=cpu";
  try {
    Problem q = p;
    q.normalize();
    q.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

void require_mask_tensor(const Problem& p, const Inputs& in) {
  if (p.mask == MaskKind::Boolean && !in.mask.defined())
    fail(ErrorKind::InvalidArgument, "flash: a boolean mask problem needs Inputs::mask");
  if (p.mask == MaskKind::Bias && !in.bias.defined())
    fail(ErrorKind::InvalidArgument, "flash: a bias mask problem needs Inputs::bias");
}

}  // namespace attnprof::cpu::flash
