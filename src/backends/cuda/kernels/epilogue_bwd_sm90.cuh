// What leaves the sm90a backward's registers (flash_bwd_sm90.cuh): a
// consumer's dQ share of one query tile added into the FP32 accumulator
// (flash_bwd_postprocess.cuh converts it), by vector reductions in whatever
// order the key tiles finish, or (deterministic) in key-tile order, each key
// tile waiting on a semaphore for the one before; and dK and dV once per key
// tile (epilogue_bwd_sm80.cuh's store_rows). The accumulators have
// mma.m16n8k16's C layout (wgmma_sm90.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/epilogue_bwd_sm80.cuh"
#include "backends/cuda/kernels/wgmma_sm90.cuh"

namespace attnprof::cuda::kernels {

__device__ __forceinline__ void red_add_v2(float* at, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(at), "f"(x), "f"(y) : "memory");
}

template <class Cfg>
struct EpilogueBwdSm90 {
  // Adds a consumer's share of dQ (the query tile's 64 rows, its kDqCols
  // columns), times the softmax scale, into the accumulator; padding columns
  // skipped.
  __device__ __forceinline__ static void add_dq(const BwdArgs& a, const float (&dq)[Cfg::kDqTiles][4],
                                                std::int64_t bh, int m0, int wg, int warp_in_wg, int lane) {
    const int row = m0 + warp_in_wg * 16 + lane / 4;
    const int col0 = wg * Cfg::kDqCols + 2 * (lane % 4);
    float* const at = a.dq_accum + (bh * a.rows_pad + row) * Cfg::kHeadDim + col0;
#pragma unroll
    for (int nt = 0; nt < Cfg::kDqTiles; ++nt) {
      if (Cfg::kPadDim == Cfg::kHeadDim || col0 + nt * 8 < Cfg::kHeadDim) {
        red_add_v2(at + nt * 8, dq[nt][0] * a.scale, dq[nt][1] * a.scale);
        red_add_v2(at + 8 * Cfg::kHeadDim + nt * 8, dq[nt][2] * a.scale, dq[nt][3] * a.scale);
      }
    }
  }

  // The same in key-tile order: this consumer's semaphore (the tile's 64 rows,
  // its column half) counts the key tiles that have added; it waits for its turn
  // (n_block - first, first being the query tile's first visible key tile),
  // adds, and passes the turn on. Key tiles start in grid order, so a key
  // tile waits only on ones already running or done. Named barrier 2 + wg:
  // the consumer's 128 threads.
  __device__ __forceinline__ static void add_dq_ordered(const BwdArgs& a, const float (&dq)[Cfg::kDqTiles][4],
                                                        std::int64_t bh, int m0, int turn, int wg, int warp_in_wg,
                                                        int lane) {
    static_assert(Cfg::kBlockM == 64, "a semaphore per 64 query rows and column half");
    int* const sem = a.dq_semaphore + 2 * (bh * (a.rows_pad / 64) + m0 / 64) + wg;
    const bool leader = warp_in_wg == 0 && lane == 0;
    if (leader) {
      int seen;
      do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(sem) : "memory");
      } while (seen != turn);
    }
    sm90::named_barrier_sync(2 + wg, 128);
    add_dq(a, dq, bh, m0, wg, warp_in_wg, lane);
    __threadfence();
    sm90::named_barrier_sync(2 + wg, 128);
    if (leader) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
  }

  // dK (times the softmax scale) and dV of this consumer's 64 keys; keys past
  // seq_k and padding columns are not stored.
  template <class Element>
  __device__ __forceinline__ static void store_dkdv(const BwdArgs& a, const float (&dk)[1][Cfg::kDTiles][4],
                                                    const float (&dv)[1][Cfg::kDTiles][4], int n0, int kv_head,
                                                    int batch, int wg, int warp_in_wg, int lane) {
    using Stored = const float(&)[1][Cfg::kHeadDim / 8][4];
    const int row0 = 64 * wg + 16 * warp_in_wg, valid = a.f.seq_k - n0;
    store_rows<Element>(a.dk + batch * a.dk_batch_stride + kv_head * a.dk_head_stride + n0 * a.dk_row_stride,
                        a.dk_row_stride, reinterpret_cast<Stored>(dk), a.scale, row0, valid, lane);
    store_rows<Element>(a.dv + batch * a.dv_batch_stride + kv_head * a.dv_head_stride + n0 * a.dv_row_stride,
                        a.dv_row_stride, reinterpret_cast<Stored>(dv), 1.f, row0, valid, lane);
  }
};

}  // namespace attnprof::cuda::kernels
