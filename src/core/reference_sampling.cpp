// Which rows the float64 reference checks (attnprof/reference.h): every query row, or every key row for dK and dV,
// of a small problem; an even sample with each head's (or (batch, kv head) pair's) first and last rows otherwise.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnprof/reference.h"

namespace attnprof {

RowSample sample_rows(const Problem& p, std::int64_t max_rows) {
  RowSample s;
  const std::int64_t total = p.heads * p.total_q();
  if (total <= max_rows) {
    s.rows.reserve(static_cast<std::size_t>(total));
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t i = 0; i < p.seq_len(b); ++i) s.rows.push_back((b * p.heads + h) * p.seq + i);
      }
    }
    return s;
  }
  // Whole heads are too many: take rows spread evenly over every (batch, head),
  // always including each head's first and last rows (the causal edges).
  const std::int64_t heads_total = p.batch * p.heads;
  const std::int64_t per_head = std::max<std::int64_t>(2, max_rows / heads_total);
  const std::int64_t head_step = std::max<std::int64_t>(1, heads_total * per_head / max_rows);
  for (std::int64_t bh = 0; bh < heads_total; bh += head_step) {
    const std::int64_t len = p.seq_len(bh / p.heads);
    if (len == 0) continue;
    for (std::int64_t k = 0; k < per_head; ++k) {
      const std::int64_t i = per_head == 1 ? 0 : k * (len - 1) / (per_head - 1);
      s.rows.push_back(bh * p.seq + i);
    }
  }
  s.rows.erase(std::unique(s.rows.begin(), s.rows.end()), s.rows.end());
  return s;
}

RowSample sample_kv_rows(const Problem& p, std::int64_t max_rows) {
  RowSample s;
  const std::int64_t pairs = p.batch * p.kv_heads;
  if (p.kv_heads * p.total_kv() <= max_rows) {
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      for (std::int64_t j = 0; j < p.kv_seq_len(pair / p.kv_heads); ++j) s.rows.push_back(pair * p.kv_seq + j);
    }
    return s;
  }
  // The first, a middle and the last (batch, kv head) pair: each costs a pass
  // over every query row of its group.
  std::vector<std::int64_t> chosen = {0, pairs / 2, pairs - 1};
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  for (const std::int64_t pair : chosen) {
    const std::int64_t len = p.kv_seq_len(pair / p.kv_heads);
    if (len == 0) continue;
    const std::int64_t per_pair = std::clamp<std::int64_t>(max_rows / static_cast<std::int64_t>(chosen.size()), 2,
                                                           std::max<std::int64_t>(len, 2));
    for (std::int64_t k = 0; k < per_pair; ++k) {
      s.rows.push_back(pair * p.kv_seq + (per_pair == 1 ? 0 : k * (len - 1) / (per_pair - 1)));
    }
  }
  s.rows.erase(std::unique(s.rows.begin(), s.rows.end()), s.rows.end());
  return s;
}

}  // namespace attnprof
