// Epilogue of the attention forwards: O / rowsum rounded to the element type,
// and, when FwdArgs::lse is not null, each row's log-sum-exp (float, [B, H,
// seq_q]). Every kernel's accumulators have mma.m16n8k16's C layout (also
// wgmma's), so one epilogue serves them all; O leaves registers one of two ways:
//   store_direct: two 16-bit values a 4-byte store, straight from registers
//                 (sm90: no shared memory free for staging, and no CTA barrier
//                 to wait for between independent consumer warpgroups);
//   store_staged: through a padded shared tile, so that the global stores are
//                 16 bytes wide and coalesced along head_dim (sm80 kernels).
// Whether the LSE is written is a template flag (kLse), chosen in dispatch
// from FwdArgs::lse, not a test of the pointer in the kernel: that test, one
// uniform branch after the key loop, still moved ptxas's register allocation
// of kernels that never write an LSE by up to 7 registers (flash sm80 D = 32
// window on sm90a 176 -> 183, sm90 D = 128 window 160 -> 166).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"
#include "backends/cuda/kernels/utils.cuh"

namespace attnprof::cuda::kernels {

// A dense batch's query rows (FwdArgs::q_spans): the rows of the tensor
// tile at cta.m0 (kBlockM rows of the batch's args `a`) that lie outside
// sequence `seq`'s rows written as zeros, their LSE (kLse) as +inf, as a
// row that sees no key. The tile computes the sequence's tile at the same
// m0 (if the sequence has one) besides.
template <bool kLse, int kBlockM, int kHeadDim, class Tile>
__device__ __forceinline__ void zero_query_rows_outside(const FwdArgs& a, const FwdArgs& seq, const Tile& cta, int tid,
                                                        int threads) {
  const auto outside = [&](int row) { return seq.q_row_outside(row); };
  zero_rows_outside(a.o + cta.batch * a.o_batch_stride + cta.head * a.o_head_stride, a.o_row_stride, kHeadDim, cta.m0,
                    kBlockM, a.seq_q, outside, tid, threads);
  if constexpr (kLse) {
    float* const lse = a.lse + cta.batch * a.lse_batch_stride + cta.head * a.lse_head_stride;
    for (int r = tid; r < kBlockM; r += threads) {
      const int row = cta.m0 + r;
      if (row < a.seq_q && outside(row)) lse[row] = INFINITY;
    }
  }
}

// kLse: write the LSE (FwdArgs::lse is then not null).
template <Half16 Element, bool kLse>
struct EpilogueFwd {
  // Rows of one warp: fragment row g of m-tile mt is tile row row0 + 16 mt + g
  // (and + 8); the quad's lane t = 0 writes it. lse: the tile's row 0.
  template <int kMTiles, int... kSoftmax>
  __device__ __forceinline__ static void store_lse(float* lse, const OnlineSoftmax<kMTiles, kSoftmax...>& softmax,
                                                   float scale_log2, int row0, int rows_valid, int lane) {
    float l[kMTiles][2];
    softmax.log_sum_exp(l, scale_log2);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mt * 16 + lane / 4 + 8 * h;
        if (lane % 4 == 0 && row < rows_valid) lse[row] = l[mt][h];
      }
    }
  }

  // O and LSE of one warp's rows [row0, row0 + 16 kMTiles) of the tile, from
  // registers: the first kStoreDTiles d-tiles (past them, a padded head dim).
  template <int kStoreDTiles, class Tile, int kMTiles, int kDTiles, int... kSoftmax>
  __device__ __forceinline__ static void store_direct(const FwdArgs& a, const Tile& cta,
                                                      const float (&acc)[kMTiles][kDTiles][4],
                                                      OnlineSoftmax<kMTiles, kSoftmax...>& softmax, int row0,
                                                      int lane) {
    float inv[kMTiles][2];
    softmax.finish(inv);
    const int rows_valid = a.seq_q - cta.m0;
    std::uint16_t* const o = cta.o(a);
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mt * 16 + g + 8 * h;
        if (row >= rows_valid) continue;
        std::uint16_t* const o_row = o + row * a.o_row_stride;
        static_assert(kStoreDTiles <= kDTiles);
#pragma unroll
        for (int dt = 0; dt < kStoreDTiles; ++dt) {
          *reinterpret_cast<std::uint32_t*>(o_row + dt * 8 + 2 * t) =
              pack2<Element>(acc[mt][dt][2 * h] * inv[mt][h], acc[mt][dt][2 * h + 1] * inv[mt][h]);
        }
      }
    }
    if constexpr (kLse) store_lse(cta.lse(a), softmax, a.scale_log2, row0, rows_valid, lane);
  }

  // O and LSE of the whole CTA's tile through the shared O tile (OTile's
  // padded layout, kThreads threads): every warp stages its rows, one CTA
  // barrier, then 16-byte copies out. The O tile may alias buffers the key
  // loop read: the caller's last barrier must have retired those reads.
  template <class OTile, int kThreads, class Tile, int kMTiles, int kDTiles>
  __device__ __forceinline__ static void store_staged(const FwdArgs& a, const Tile& cta, std::uint16_t* o_smem,
                                                      const float (&acc)[kMTiles][kDTiles][4],
                                                      OnlineSoftmax<kMTiles>& softmax, int row0, int lane, int tid) {
    float inv[kMTiles][2];
    softmax.finish(inv);
    if constexpr (kLse) store_lse(cta.lse(a), softmax, a.scale_log2, row0, a.seq_q - cta.m0, lane);
    stage_o<OTile>(o_smem, acc, inv, row0, lane);
    __syncthreads();
    // O's address is formed here, not kept live through the key loop (registers are at the cap).
    store_tile<OTile::kRowsN, OTile::kCols, kThreads>(cta.o(a), a.o_row_stride, o_smem, a.seq_q - cta.m0, tid);
  }

 private:
  // Writes one warp's normalised O fragments into the shared O tile. With the
  // padded row pitch, the 32 lanes' 4-byte writes (8 rows x 4 column pairs)
  // land in 32 distinct banks.
  template <class OTile, int kMTiles, int kDTiles>
  __device__ __forceinline__ static void stage_o(std::uint16_t* o_smem, const float (&o)[kMTiles][kDTiles][4],
                                                 const float (&inv)[kMTiles][2], int row0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + mt * 16 + g + 8 * h;
          const int col = dt * 8 + 2 * t;
          *reinterpret_cast<std::uint32_t*>(o_smem + OTile::offset(row, col)) =
              pack2<Element>(o[mt][dt][2 * h] * inv[mt][h], o[mt][dt][2 * h + 1] * inv[mt][h]);
        }
      }
    }
  }

  // Copies rows [0, rows_valid) of the shared O tile to global memory.
  template <int kRows, int kHeadDim, int kThreads>
  __device__ __forceinline__ static void store_tile(std::uint16_t* gmem, std::int64_t row_stride,
                                                    const std::uint16_t* smem, int rows_valid, int tid) {
    using Tile = SmemTile<kRows, kHeadDim>;
    constexpr int kChunksPerRow = kHeadDim / 8;
    constexpr int kChunks = kRows * kChunksPerRow;
    constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c = i * kThreads + tid;
      if (kChunks % kThreads == 0 || c < kChunks) {
        const int row = c / kChunksPerRow;
        const int col = (c % kChunksPerRow) * 8;
        if (row < rows_valid) {
          *reinterpret_cast<uint4*>(gmem + (row * static_cast<int>(row_stride) + col)) =
              *reinterpret_cast<const uint4*>(smem + Tile::offset(row, col));
        }
      }
    }
  }
};

}  // namespace attnprof::cuda::kernels
