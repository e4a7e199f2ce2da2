// Epilogue of the attention forwards: O / rowsum, rounded to the input dtype,
// staged through shared memory so that the global stores are 16 bytes wide
// and coalesced along head_dim (the fragments alone would give 4-byte stores).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/mma_sm80.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"

namespace attnprof::cuda::kernels {

// Writes one warp's normalised O fragments into the shared O tile. row0: the
// warp's first tile row. With the padded row pitch, the 32 lanes' 4-byte
// writes (8 rows x 4 column pairs) land in 32 distinct banks.
template <bool kBf16, class OTile, int kMTiles, int kDTiles>
__device__ __forceinline__ void stage_o(std::uint16_t* o_smem, const float (&o)[kMTiles][kDTiles][4],
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
            pack_half2<kBf16>(o[mt][dt][2 * h] * inv[mt][h], o[mt][dt][2 * h + 1] * inv[mt][h]);
      }
    }
  }
}

// Copies rows [0, rows_valid) of the shared O tile to global memory.
template <int kRows, int kHeadDim, int kThreads>
__device__ __forceinline__ void store_tile(std::uint16_t* gmem, std::int64_t row_stride, const std::uint16_t* smem,
                                           int rows_valid, int tid) {
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

}  // namespace attnprof::cuda::kernels
