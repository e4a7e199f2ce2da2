// The sm90a backward's scheduling (flash_bwd_sm90.cuh): which CTA of the
// static grid takes which key tile of which (kv head, batch) pair, where each
// key tile's walk over its query tiles starts, and (deterministic) each key
// tile's turn to add into a query tile's dQ.
//
// The grid is static. Under a mask, the key tile slowest and (kv head,
// batch) fastest, so that CTAs start in key-tile order: the low key tiles,
// which every later query sees, are the heaviest, and start first (longest
// first: the last wave holds the light ones). Not across all heads at once,
// though: in chunks of heads, each at least two waves of CTAs
// (BwdOrderSm90::chunks). In key-tile order across 128 heads (8 x 16 x
// 4096 x 128) a wave held key tile n of every head and streamed every
// head's Q, dO and dQ accumulator from DRAM: 4.14 ms, 2.76 in chunks of 4
// heads (docs/perf/issue21-2026-12-03c.md). Unmasked, every CTA
// has the same work, and the key tile goes fastest instead: a wave then
// holds a head or two whole, whose Q, dO and dQ accumulator stay in L2 (in
// key-tile order across all 32 heads of 2 x 16 x 8192 x 128 a wave streamed
// every head's, 7.7 GB from DRAM against cuDNN's 0.75, and L2 hits 73% against
// 97%: Nsight Compute, docs/perf/issue21-2026-12-02b.md). So do the wide
// head dims under a mask: a head's Q, dO and dQ accumulator are 8 MB at 256,
// and in key-tile order the kernel was L2-bound (L2 throughput 87%, hits 69%,
// DRAM 44% against cuDNN's 92% and 8%: docs/perf/issue21-2026-12-03.md).
//
// Deterministic runs add each query tile's dQ in a fixed order of its key
// tiles (BwdOrderSm90::dq_turn). Where a head's key tiles fit one a
// multiprocessor, unmasked, or under a mask where the consumers take the
// turns themselves (head dim 256: kConsumerTurns), the key tile goes fastest
// (a wave holds heads whole, as the default's order there) and each key tile
// waits on the one above it, n + 1, which reaches the tile no later in its
// own walk:
// - unmasked, with the walks rotated as without determinism (key tile n
//   waits on n + 1, which reached the tile a step or two before it);
// - under a mask, each query tile's key tiles add from the highest down:
//   the higher a key tile, the lower its walk starts from the tile
//   (FlashAttention-3's order for causal masks, launched here from key
//   tile 0 up: the heavy tiles first).
// Key tile n + 1 is launched after n, so these waits are safe only when all
// of a head's key tiles can be resident at once: at most one a
// multiprocessor. Elsewhere, key-tile order (the key tile slowest, one
// chunk), each query tile's key tiles adding from the lowest up: key tile n
// waits on n - 1, launched before it (a staircase of waits across the key
// tiles running at once, paid once a wave).
// Measured on the H200 (docs/perf/issue21-2026-12-04.md): under a mask the
// highest-first order took 1.50x the default at head dim 256 against 1.75x in
// key-tile order, but where the dQ writer warp takes the turns (head dims up
// to 192) it lost to key-tile order on every masked row: 1.10-1.38x against
// 1.02-1.30x with the writer passing each turn as its adds land, worse (up
// to 2.6x) with the writer's one-tile-late pass (write_dq), which chains a
// head's key tiles to the top one's pace in that order. Launched from the
// last key tile down it lost 30-80% (docs/perf/issue21-2026-12-03b.md).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/mainloop_bwd_sm90.cuh"

namespace attnprof::cuda::kernels {

template <class Cfg, MaskMode kMask>
struct BwdOrderSm90 {
  // The consumers take the dQ turns themselves, on their own path: no room
  // to stage dQ for the writer warp (head dim 256).
  static constexpr bool kConsumerTurns = !MainloopBwdSm90<Cfg, kMask, Bf16>::kDqStaged;
  // The grid's order (the header), decided at launch (BwdArgs::key_tile_fastest):
  // the key tile fastest unmasked and at the wide head dims; deterministic,
  // unmasked or with the consumers' own turns, and only when a head's key
  // tiles fit one a multiprocessor.
  static bool key_tile_fastest(bool deterministic, int key_tiles, int multiprocessors) {
    static_assert(Cfg::kWide == (Cfg::kPadDim > 128) && kConsumerTurns == (Cfg::kPadDim > 192),
                  "bwd_sm90_key_tile_fastest (fused_params.h) reads these from the padded head dim");
    return bwd_sm90_key_tile_fastest(deterministic, kMask != MaskMode::None, Cfg::kPadDim, key_tiles, multiprocessors);
  }
  // Key tile slowest: the grid's (kv head, batch) pairs in `chunks` chunks
  // of consecutive pairs, as even as they divide (the first pairs % chunks
  // take one more), each chunk in key-tile order (the pair fastest): CTA
  // `id` of the 1-D grid is key tile n_block of pair `pair`. Within a pair,
  // key tiles start in order (deterministic: key tile n waits only on n - 1).
  __host__ __device__ static void chunked_cta(int id, int n_tiles, int pairs, int chunks, int& n_block, int& pair) {
    const int narrow = pairs / chunks, wide = pairs % chunks;  // wide: the chunks of narrow + 1 pairs, first
    const int wide_ctas = wide * (narrow + 1) * n_tiles;
    int width, first, r;
    if (id < wide_ctas) {
      width = narrow + 1;
      const int c = id / (width * n_tiles);
      first = c * width;
      r = id - c * width * n_tiles;
    } else {
      width = narrow;
      const int c = (id - wide_ctas) / (width * n_tiles);
      first = wide * (narrow + 1) + c * width;
      r = id - wide_ctas - c * width * n_tiles;
    }
    n_block = r / width;
    pair = first + r % width;
  }
  // How many chunks: each of at least two waves of CTAs (2 x the
  // multiprocessors), so that the resident CTAs share a few heads' Q, dO and
  // dQ accumulator in L2, while the heavy key tiles of every chunk start
  // early enough: a chunk's first key tiles walk the most query tiles, and
  // the last chunk's start no earlier than its own CTAs from the end. A grid
  // of less than four waves is one chunk. Measured on the H200
  // (docs/perf/issue21-2026-12-03c.md): chunks of 128-512 CTAs gained 2-33%
  // over key-tile order; a last chunk of 64 (two pairs of 32 key tiles) or
  // chunks of 64 (the 2-wave grid of 4 x 16 / 4 heads x 2048) lost to that
  // tail. Deterministic: one chunk, key-tile order (in chunks a wave holds
  // more key tiles of a head, and key tile n waits on n - 1: 2.63 -> 4.28 ms
  // at 2 x 16 x 8192 x 128 causal).
  static int chunks(bool deterministic, int n_tiles, int pairs, int multiprocessors) {
    return static_cast<int>(bwd_sm90_chunks(deterministic, n_tiles, pairs, multiprocessors));
  }
  // Where key tile n_block's walk over its query tiles starts. Unmasked with
  // the key tile fastest, a head's key tiles run together: each starts at its
  // own share of the query tiles, so that they do not reduce-add into the
  // same dQ tile together (under a mask the first tiles differ already).
  __device__ static int walk_shift(const FwdArgs& f, const QueryWalk& walk, int n_block, bool fastest) {
    if (kMask != MaskMode::None || !fastest) return 0;
    const int key_tiles = (f.seq_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
    return static_cast<int>(static_cast<std::int64_t>(n_block) * walk.count() / key_tiles);
  }
  // Deterministic: key tile n_block's turn among the key tiles that add into
  // the query tile at m0 (the header's orders). Rotated walks: key tile n
  // reaches the tile's index j at step j - shift(n) (mod the walk's length c),
  // so the first there is the last n with shift(n) = n c / nb <= j, then the
  // ones below it, then down from the top.
  __device__ static int dq_turn(const FwdArgs& f, const QueryWalk& walk, int m0, int n_block, bool fastest) {
    const KeyTiles kt = key_tiles<kMask, Cfg::kBlockM, Cfg::kBlockN>(f, m0);
    if (!fastest) return n_block - kt.begin;
    if constexpr (kMask != MaskMode::None) return kt.end - 1 - n_block;
    const int nb = kt.end, c = walk.count(), j = m0 / Cfg::kBlockM - walk.tiles.begin;
    const int first = static_cast<int>(((j + 1) * static_cast<std::int64_t>(nb) - 1) / c);
    return first >= n_block ? first - n_block : first - n_block + nb;
  }
};

}  // namespace attnprof::cuda::kernels
