// Global -> shared tile copies through cp.async (sm80+), and the padded
// shared-memory layout every attention tile uses.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/mma_sm80.cuh"

namespace attnprof::cuda::kernels {

// A [kRows, kHeadDim] tile of 16-bit elements, row-major, each row padded by
// one 16-byte chunk. With the pad, consecutive rows start 4 banks apart, so
// the 8 row addresses of one ldmatrix phase (and the 8 chunks one cp.async
// phase writes) fall in distinct banks for every head dim we build
// (row pitch 2*D+16 bytes = 4 words mod 32 for D = 64, 128, 256; 20 words
// mod 32 for D = 32, 96: still 8 distinct multiples of 4).
template <int kRows, int kHeadDim>
struct SmemTile {
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16 (one mma k-step)");
  static constexpr int kRowsN = kRows;
  static constexpr int kStride = kHeadDim + 8;  // elements
  static constexpr int kElems = kRows * kStride;
  static constexpr int kBytes = kElems * 2;
  __device__ static constexpr int offset(int row, int col) { return row * kStride + col; }
};

// 16 bytes global -> shared, skipping L1. With valid == false nothing is read
// and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Issues the copies of rows [0, kRows) of a row-strided global matrix into a
// padded tile; rows >= rows_valid are zero-filled, so a key past seq_k meets
// P = 0 with V = 0 (never 0 * stale NaN). Each thread copies 16-byte chunks;
// consecutive threads take consecutive chunks of a row (coalesced).
template <int kRows, int kHeadDim, int kThreads>
__device__ __forceinline__ void load_tile_async(std::uint16_t* smem, const std::uint16_t* gmem,
                                                std::int64_t row_stride, int rows_valid, int tid) {
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
      const bool valid = row < rows_valid;
      // 32-bit offset inside the tile (kRows * row_stride < 2^31, checked on
      // the host): halves the address registers the prefetch keeps live.
      const std::uint16_t* src = valid ? gmem + (row * static_cast<int>(row_stride) + col) : gmem;
      cp_async_16(smem_u32(smem + Tile::offset(row, col)), src, valid);
    }
  }
}

}  // namespace attnprof::cuda::kernels
