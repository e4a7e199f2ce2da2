#include "attnprof/varlen.h"

#include "attnprof/error.h"
#include "core/rows.h"

namespace attnprof {

Tensor packed_rows(const Tensor& t, std::int64_t first, std::int64_t n) {
  if (t.size(0) != 1 || first < 0 || n < 0 || first + n > t.size(2)) {
    fail(ErrorKind::Internal,
         "packed_rows: rows " + std::to_string(first) + " .. " + std::to_string(first + n) + " of " + t.describe());
  }
  return t.as_strided({1, t.size(1), n, t.size(3)}, t.strides(), t.offset() + first * t.stride(2));
}

// Sequence b's rows, from the one sequence view (core/rows.h).
Tensor sequence_q_rows(const Problem& p, const Tensor& t, std::int64_t b) {
  const SequenceRows r = sequence_views(p)[static_cast<std::size_t>(b)].rows;
  return packed_rows(t, r.q.begin, r.q_len());
}

Tensor sequence_kv_rows(const Problem& p, const Tensor& t, std::int64_t b) {
  const SequenceRows r = sequence_views(p)[static_cast<std::size_t>(b)].rows;
  return packed_rows(t, r.k.begin, r.k_len());
}

Inputs sequence_inputs(const Problem& p, const Inputs& in, std::int64_t b) {
  const SequenceRows r = sequence_views(p)[static_cast<std::size_t>(b)].rows;
  Inputs s;
  s.q = packed_rows(in.q, r.q.begin, r.q_len());
  s.k = packed_rows(in.k, r.k.begin, r.k_len());
  s.v = packed_rows(in.v, r.k.begin, r.k_len());
  s.q_descale = in.q_descale;
  s.k_descale = in.k_descale;
  s.v_descale = in.v_descale;
  s.q_descale_tensor = in.q_descale_tensor;
  s.k_descale_tensor = in.k_descale_tensor;
  s.v_descale_tensor = in.v_descale_tensor;
  return s;
}

}  // namespace attnprof
