// Zigzag layout and the pair table (sharding.h).
#include "parallel/sharding.h"

#include <string>

#include "attnprof/error.h"

namespace attnprof::parallel {

std::int64_t ZigzagLayout::global_row(int rank, std::int64_t local_row) const {
  const auto c = chunks_of(rank)[local_row < chunk ? 0 : 1];
  return static_cast<std::int64_t>(c) * chunk + local_row % chunk;
}

ZigzagLayout zigzag_layout(const Problem& p, int world) {
  if (world < 1) fail(ErrorKind::InvalidArgument, "gpus must be at least 1, got " + std::to_string(world), {"gpus"});
  const std::int64_t n2 = 2 * static_cast<std::int64_t>(world);
  if (p.seq % n2 != 0) {
    fail(ErrorKind::InvalidArgument,
         "seq " + std::to_string(p.seq) + " must be a multiple of 2N = " + std::to_string(n2) +
             " for zigzag sharding over " + std::to_string(world) + " GPUs",
         {"seq"});
  }
  return {world, p.seq, p.seq / n2};
}

// Structural masks give each query row one interval of visible keys, so its
// first and last key of the chunk and the keys either side of the diagonal
// tell the three kinds apart in O(chunk) calls of Problem::visible.
PairKind classify_pair(const Problem& p, const ZigzagLayout& l, int qc, int kc) {
  const std::int64_t c = l.chunk, q0 = qc * c, k0 = kc * c, k1 = k0 + c - 1;
  bool all_full = true, all_skip = true, all_diag = true;
  for (std::int64_t r = 0; r < c; ++r) {
    const std::int64_t i = q0 + r;
    const bool first = p.visible(i, k0), last = p.visible(i, k1);
    const bool on_diag = p.visible(i, k0 + r);
    const bool past_diag = r + 1 < c && p.visible(i, k0 + r + 1);
    all_full = all_full && first && last;
    all_skip = all_skip && !first && !last && !on_diag;
    all_diag = all_diag && first && on_diag && !past_diag && (r + 1 == c || !last);
  }
  if (all_full) return PairKind::Full;
  if (all_skip) return PairKind::Skip;
  if (all_diag) return PairKind::Diagonal;
  fail(ErrorKind::Unsupported, std::string("the ") + std::string(mask_name(p.mask)) + " mask cuts query chunk " +
                                   std::to_string(qc) + " against key chunk " + std::to_string(kc) +
                                   " in a way ring attention does not take: use mask=none or mask=causal");
}

std::vector<std::vector<PairKind>> pair_table(const Problem& p, const ZigzagLayout& l) {
  std::vector<std::vector<PairKind>> t(static_cast<std::size_t>(l.chunks()));
  for (int qc = 0; qc < l.chunks(); ++qc) {
    for (int kc = 0; kc < l.chunks(); ++kc) t[static_cast<std::size_t>(qc)].push_back(classify_pair(p, l, qc, kc));
  }
  return t;
}

void check_ring_problem(const Problem& p, int world) {
  if (world < 1) fail(ErrorKind::InvalidArgument, "gpus must be at least 1, got " + std::to_string(world), {"gpus"});
  if (p.device != Device::Cuda) fail(ErrorKind::Unsupported, "gpus needs device=cuda", {"gpus"});
  if (p.pass != Pass::Forward) fail(ErrorKind::Unsupported, "gpus runs the forward only: use pass=forward", {"gpus"});
  if (p.mask != MaskKind::None && p.mask != MaskKind::Causal) {
    fail(ErrorKind::Unsupported, "gpus takes mask=none or mask=causal, not " + std::string(mask_name(p.mask)),
         {"gpus"});
  }
  if (p.kv_seq != p.seq)
    fail(ErrorKind::Unsupported, "gpus needs kv_seq equal to seq (self-attention)", {"gpus", "kv_seq", "seq"});
  if (p.kv_heads != p.heads)
    fail(ErrorKind::Unsupported, "gpus does not take grouped-query heads: kv_heads must equal heads",
         {"gpus", "kv_heads", "heads"});
  if (p.kv_cache == KvCache::Paged)
    fail(ErrorKind::Unsupported, "gpus reads a contiguous KV cache: use kv_cache=contiguous", {"gpus"});
  if (p.dtype != DType::BF16 && p.dtype != DType::F16) {
    fail(ErrorKind::Unsupported, "gpus runs flash, which takes dtype=bf16 or dtype=fp16", {"gpus"});
  }
  (void)zigzag_layout(p, world);
}

}  // namespace attnprof::parallel
