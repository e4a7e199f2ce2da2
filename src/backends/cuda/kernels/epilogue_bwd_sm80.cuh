// What leaves the backward's registers for global memory (flash_bwd_sm80.cuh):
// dK and dV once per key tile, dQ once per query tile (deterministic), both
// rounded to the element type through element.cuh's pack2; or dQ added into
// the FP32 accumulator with atomics, which flash_bwd_postprocess.cuh converts.
// The accumulators have mma.m16n8k16's C layout (mma_sm80.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels {

// Stores a warp's 16 rows of a [rows, D] f32 accumulator times `scale` into a
// 16-bit matrix (rows >= rows_valid skipped). base: the tile's row 0.
template <Half16 Element, int kDTiles>
__device__ __forceinline__ void store_rows(std::uint16_t* base, std::int64_t row_stride,
                                           const float (&acc)[1][kDTiles][4], float scale, int row0, int rows_valid,
                                           int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
    if (row >= rows_valid) continue;
    std::uint16_t* const out = base + row * row_stride;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      *reinterpret_cast<std::uint32_t*>(out + dt * 8 + 2 * t) =
          pack2<Element>(acc[0][dt][2 * h] * scale, acc[0][dt][2 * h + 1] * scale);
    }
  }
}

// Adds a warp's 16 rows of dQ (f32 accumulator fragments, rows row0 + g and
// row0 + g + 8) times a.scale into the FP32 dQ accumulator [B, H, rows_pad, kHeadDim]
// with atomics; rows past seq_q skipped.
template <int kHeadDim, int kDTiles>
__device__ __forceinline__ void add_dq_atomic(const BwdArgs& a, const float (&dq)[1][kDTiles][4], int batch, int head,
                                              int row0, int lane) {
  const FwdArgs& f = a.f;
  const int gq = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + gq + 8 * h;
    if (row >= f.seq_q) continue;
    float* const acc =
        a.dq_accum + ((static_cast<std::int64_t>(batch) * f.heads + head) * a.rows_pad + row) * kHeadDim + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      atomicAdd(acc + dt * 8, dq[0][dt][2 * h] * a.scale);
      atomicAdd(acc + dt * 8 + 1, dq[0][dt][2 * h + 1] * a.scale);
    }
  }
}

}  // namespace attnprof::cuda::kernels
