// Which (query tile, head, batch) a CTA works on, and in what order.
//
// A tile scheduler gives the grid to launch and, on the device, each CTA's
// first tile and its next one:
//   static constexpr bool kPersistent;   // may a CTA take more than one tile?
//   static dim3 grid(const FwdArgs&, int sms);
//   __device__ static Tile first(const FwdArgs&);        // always a real tile
//   __device__ static bool next(const FwdArgs&, Tile&);  // false: this CTA is done
// so a kernel's work loop is `Tile t = S::first(a); do { ... } while (S::next(a, t));`.
// Masked problems (causal, window) take their query tiles longest first (the
// persistent scheduler: within each L2 section): the last tiles see the most
// keys, and started first they do not trail the rest.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

// One query tile of one head: its first row, head and batch, and the base
// addresses they give.
template <MaskMode kMask, int kBlockM>
struct CtaTile {
  int m0, head, batch, kv_head;
  int index;  // the tile's place in a persistent scheduler's order (unused by the static one)

  __device__ __forceinline__ CtaTile(const FwdArgs& a, int m0_, int head_, int batch_, int index_ = 0)
      : m0(m0_), head(head_), batch(batch_), kv_head(head_ / a.group), index(index_) {}

  // Row m0 of this head's Q and O; row 0 of its K and V (grouped heads share them).
  __device__ __forceinline__ const std::uint16_t* q(const FwdArgs& a) const {
    return a.q + batch * a.q_batch_stride + head * a.q_head_stride + m0 * a.q_row_stride;
  }
  __device__ __forceinline__ const std::uint16_t* k(const FwdArgs& a) const {
    return a.k + batch * a.k_batch_stride + kv_head * a.k_head_stride;
  }
  __device__ __forceinline__ const std::uint16_t* v(const FwdArgs& a) const {
    return a.v + batch * a.v_batch_stride + kv_head * a.v_head_stride;
  }
  __device__ __forceinline__ std::uint16_t* o(const FwdArgs& a) const {
    return a.o + batch * a.o_batch_stride + head * a.o_head_stride + m0 * a.o_row_stride;
  }
  // Row m0 of this head's log-sum-exp ([B, H, seq_q], or a packed batch's
  // [1, H, total_q] at the sequence's rows); a.lse must not be null.
  __device__ __forceinline__ float* lse(const FwdArgs& a) const {
    return a.lse + batch * a.lse_batch_stride + head * a.lse_head_stride + m0;
  }
};

template <int kBlockM>
__host__ __device__ __forceinline__ int query_tiles(const FwdArgs& a) {
  return (a.seq_q + kBlockM - 1) / kBlockM;
}

// One CTA per tile: grid (query tiles, heads, batch), read from blockIdx.
template <MaskMode kMask, int kBlockM>
struct StaticTileScheduler {
  static constexpr bool kPersistent = false;
  using Tile = CtaTile<kMask, kBlockM>;

  static dim3 grid(const FwdArgs& a, int /*sms*/) { return dim3(query_tiles<kBlockM>(a), a.heads, a.batch); }

  __device__ __forceinline__ static Tile first(const FwdArgs& a) {
    // In unsigned arithmetic, as blockIdx is: the int form moved ptxas's
    // register allocation of the sm80 flash window kernels (+3-4 on sm90a).
    const unsigned m_block = kMask == MaskMode::None ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
    return Tile(a, static_cast<int>(m_block * kBlockM), blockIdx.y, blockIdx.z);
  }
  __device__ __forceinline__ static bool next(const FwdArgs&, Tile&) { return false; }
};

// One CTA per multiprocessor, each walking the tiles gridDim.x apart in one
// order. The (batch, head) pairs are cut into sections whose K and V fit in
// kL2Bytes together; section after section, query tiles longest first (for
// masked problems), then the section's pairs. So the CTAs at work at once
// read the K and V of a few heads, which stay in L2, instead of one tile of
// every head (FlashAttention-3's L2 swizzle). Kernels that take it must hand
// shared buffers (Q) back between tiles.
// kL2Bytes: 32 MB of the H200's 50 (FlashAttention-3's figure for the H100);
// the tests take a small one to cut small problems into several sections.
template <MaskMode kMask, int kBlockM, int kHeadDim, std::int64_t kL2Bytes = std::int64_t{32} << 20>
struct PersistentTileScheduler {
  static constexpr bool kPersistent = true;
  using Tile = CtaTile<kMask, kBlockM>;

  static int tiles(const FwdArgs& a) { return query_tiles<kBlockM>(a) * a.heads * a.batch; }
  static dim3 grid(const FwdArgs& a, int sms) { return dim3(tiles(a) < sms ? tiles(a) : sms); }

  // (batch, head) pairs a section: K and V of one query head take 2 seq_k
  // kHeadDim 16-bit values, shared by the group's heads.
  __host__ __device__ __forceinline__ static int section_pairs(const FwdArgs& a) {
    const std::int64_t per_pair = 4LL * a.seq_k * kHeadDim / a.group;
    const std::int64_t fit = kL2Bytes / (per_pair > 0 ? per_pair : 1);
    const int pairs = a.heads * a.batch;
    return fit < 1 ? 1 : (fit > pairs ? pairs : static_cast<int>(fit));
  }

  __device__ __forceinline__ static Tile at(const FwdArgs& a, int index) {
    const int m_blocks = query_tiles<kBlockM>(a), pairs = a.heads * a.batch;
    const int group = section_pairs(a), per_section = group * m_blocks;
    const int section = index / per_section, first_pair = section * group;
    const int in_section = pairs - first_pair < group ? pairs - first_pair : group;  // the last may be short
    const int rest = index - section * per_section;
    const int rank = rest / in_section, pair = first_pair + rest % in_section;
    const int m_block = kMask == MaskMode::None ? rank : m_blocks - 1 - rank;
    return Tile(a, m_block * kBlockM, pair % a.heads, pair / a.heads, index);
  }
  __device__ __forceinline__ static Tile first(const FwdArgs& a) { return at(a, blockIdx.x); }
  __device__ __forceinline__ static bool next(const FwdArgs& a, Tile& t) {
    const int index = t.index + static_cast<int>(gridDim.x);
    if (index >= query_tiles<kBlockM>(a) * a.heads * a.batch) return false;
    t = at(a, index);
    return true;
  }
};

}  // namespace attnprof::cuda::kernels
