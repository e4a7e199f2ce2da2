#include "attnprof/varlen.h"

#include "attnprof/error.h"

namespace attnprof {

Tensor packed_rows(const Tensor& t, std::int64_t first, std::int64_t n) {
  if (t.size(0) != 1 || first < 0 || n < 0 || first + n > t.size(2)) {
    fail(ErrorKind::Internal,
         "packed_rows: rows " + std::to_string(first) + " .. " + std::to_string(first + n) + " of " + t.describe());
  }
  return t.as_strided({1, t.size(1), n, t.size(3)}, t.strides(), t.offset() + first * t.stride(2));
}

Tensor sequence_q_rows(const Problem& p, const Tensor& t, std::int64_t b) {
  std::int64_t first = 0;
  for (std::int64_t s = 0; s < b; ++s) first += p.seq_len(s);
  return packed_rows(t, first, p.seq_len(b));
}

Tensor sequence_kv_rows(const Problem& p, const Tensor& t, std::int64_t b) {
  std::int64_t first = 0;
  for (std::int64_t s = 0; s < b; ++s) first += p.kv_seq_len(s);
  return packed_rows(t, first, p.kv_seq_len(b));
}

Inputs sequence_inputs(const Problem& p, const Inputs& in, std::int64_t b) {
  Inputs s;
  s.q = sequence_q_rows(p, in.q, b);
  s.k = sequence_kv_rows(p, in.k, b);
  s.v = sequence_kv_rows(p, in.v, b);
  s.q_descale = in.q_descale;
  s.k_descale = in.k_descale;
  s.v_descale = in.v_descale;
  s.q_descale_tensor = in.q_descale_tensor;
  s.k_descale_tensor = in.k_descale_tensor;
  s.v_descale_tensor = in.v_descale_tensor;
  return s;
}

}  // namespace attnprof
