// Global -> shared tile copies through cp.async (sm80+), and the padded
// shared-memory layout every attention tile uses.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/utils.cuh"

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
  static constexpr int kCols = kHeadDim;
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

// Copies kRows-row tiles of one row-strided global matrix (K or V, streamed
// tile after tile, or Q once) into padded shared tiles with cp.async. Rows
// >= rows_valid are zero-filled, so a key past seq_k meets P = 0 with V = 0
// (never 0 * stale NaN). Each thread copies 16-byte chunks; consecutive
// threads take consecutive chunks of a row (coalesced).
//
// When a row's chunks divide the threads (every head dim but 96), a thread
// keeps one column for good and the stream holds a pointer already at that
// thread's first chunk: one 64-bit register pair per matrix, where a base
// plus a per-thread offset cost the D = 128 flash kernel three spilled
// registers reloaded on every key tile (H200, 2x16x8192x128 non-causal: 3.16
// ms without the spill, 3.27 ms with it; docs/perf/fused-kernels.md, run 5).
template <int kRows, int kHeadDim, int kThreads>
class TileStream {
  using Tile = SmemTile<kRows, kHeadDim>;
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
  static constexpr bool kFixedColumn = kThreads % kChunksPerRow == 0;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // kFixedColumn only

 public:
  // base: row 0 of the matrix. Offsets inside one tile are 32-bit
  // (kRows * row_stride < 2^31, checked on the host).
  __device__ __forceinline__ TileStream(const std::uint16_t* base, std::int64_t row_stride, int tid)
      : src_(kFixedColumn ? base + ((tid / kChunksPerRow) * static_cast<int>(row_stride) + (tid % kChunksPerRow) * 8)
                          : base),
        stride_(static_cast<int>(row_stride)) {}

  // Rows [row, row + kRows) into smem. safe: any readable global address (row
  // 0 of the matrix will do), given to the zero-filled copies, which read nothing.
  __device__ __forceinline__ void load(std::uint16_t* smem, int row, int rows_valid, const std::uint16_t* safe,
                                       int tid) const {
    const std::uint16_t* src = src_ + static_cast<std::int64_t>(row) * stride_;
    if constexpr (kFixedColumn) {
      const int row0 = tid / kChunksPerRow;
      const std::uint32_t dst = smem_u32(smem + Tile::offset(row0, (tid % kChunksPerRow) * 8));
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        if (kChunks % kThreads == 0 || i * kThreads + tid < kChunks) {
          const bool valid = row0 + i * kRowsPerPass < rows_valid;
          cp_async_16(dst + 2 * Tile::offset(i * kRowsPerPass, 0), valid ? src : safe, valid);
        }
        src += kRowsPerPass * stride_;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int c = i * kThreads + tid;
        if (kChunks % kThreads == 0 || c < kChunks) {
          const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
          const bool valid = r < rows_valid;
          cp_async_16(smem_u32(smem + Tile::offset(r, col)), valid ? src + (r * stride_ + col) : safe, valid);
        }
      }
    }
  }

 private:
  const std::uint16_t* src_;  // kFixedColumn: this thread's first chunk of row 0; else row 0
  int stride_;
};

// One tile, rows [0, kRows) of gmem (Q's tile, or a kernel that recomputes
// its K/V addresses each tile).
template <int kRows, int kHeadDim, int kThreads>
__device__ __forceinline__ void load_tile_async(std::uint16_t* smem, const std::uint16_t* gmem, std::int64_t row_stride,
                                                int rows_valid, int tid) {
  TileStream<kRows, kHeadDim, kThreads>(gmem, row_stride, tid).load(smem, 0, rows_valid, gmem, tid);
}

}  // namespace attnprof::cuda::kernels
