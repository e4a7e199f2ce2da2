// Zigzag sharding of a sequence over a ring of GPUs (context parallelism):
// the sequence is cut into 2N equal chunks and rank r holds chunks r and
// 2N-1-r of Q, K and V, so that under a causal mask every rank has the same
// work. Which (query chunk, key chunk) pairs are skipped, fully visible or
// causal-diagonal is read off Problem::visible, so it cannot drift from the
// masks the float64 reference applies.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "attnprof/problem.h"

namespace attnprof::parallel {

struct ZigzagLayout {
  int world = 1;
  std::int64_t seq = 0;
  std::int64_t chunk = 0;  // rows per chunk: seq / (2 * world)

  int chunks() const { return 2 * world; }
  // The two chunks rank r holds, in the order its shard stores them.
  std::array<int, 2> chunks_of(int rank) const { return {rank, 2 * world - 1 - rank}; }
  std::int64_t shard_rows() const { return 2 * chunk; }
  // The global row of a rank's local row (the same for queries and keys).
  std::int64_t global_row(int rank, std::int64_t local_row) const;
};

// The layout of p.seq over `world` ranks. Throws Error(InvalidArgument) when
// the sequence does not cut into 2N equal chunks.
ZigzagLayout zigzag_layout(const Problem& p, int world);

enum class PairKind : std::uint8_t {
  Skip,      // no query of the chunk sees a key of the other
  Full,      // every query sees every key: no mask
  Diagonal,  // query row i of the chunk sees key rows j <= i (causal within the pair)
};

// The kind of (query chunk qc, key chunk kc) under p's mask. Throws
// Error(Unsupported) when the pattern is none of the three (a mask the ring
// does not take).
PairKind classify_pair(const Problem& p, const ZigzagLayout& l, int qc, int kc);

// Every pair's kind: table[qc][kc].
std::vector<std::vector<PairKind>> pair_table(const Problem& p, const ZigzagLayout& l);

// Refuses, in one line each, what the ring does not take: a world below 1, a
// device other than CUDA, masks other than none and causal, kv_seq != seq,
// grouped-query heads, a pass other than the forward, and a sequence that does
// not cut into 2N chunks.
void check_ring_problem(const Problem& p, int world);

}  // namespace attnprof::parallel
