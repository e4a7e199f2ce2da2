// The work of the backward's tile kernels (flash_bwd_sm80.cuh) on one
// (query tile, key tile) pair, on mma.sync with operands in padded shared
// tiles (warp_gemm_sm80.cuh's warp_gemm_ss): the query tile's Q, dO, LSE and D into shared memory, P recomputed
// from the saved LSE and dS = P (dP - D) for a warp's 16 query rows, and P or
// dS written back to shared memory as 16-bit operands of dV, dK and dQ.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/warp_gemm_sm80.cuh"

namespace attnprof::cuda::kernels {

// Loads a query tile's Q and dO (cp.async, committed), its LSE (in log2 units)
// and D; rows past seq_q read as zeros with LSE +inf.
template <class Cfg>
__device__ __forceinline__ void load_query_tile(const BwdArgs& a, unsigned char* smem, int batch, int head, int m0,
                                                int tid) {
  const FwdArgs& f = a.f;
  const std::uint16_t* q = f.q + batch * f.q_batch_stride + head * f.q_head_stride + m0 * f.q_row_stride;
  const std::uint16_t* d_o = a.dout + batch * a.do_batch_stride + head * a.do_head_stride + m0 * a.do_row_stride;
  load_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(reinterpret_cast<std::uint16_t*>(smem + Cfg::kQOff), q,
                                                              f.q_row_stride, f.seq_q - m0, tid);
  load_tile_async<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kThreads>(reinterpret_cast<std::uint16_t*>(smem + Cfg::kDoOff), d_o,
                                                              a.do_row_stride, f.seq_q - m0, tid);
  cp_async_commit();
  if (tid < Cfg::kBlockM) {
    const int row = m0 + tid;
    const std::int64_t bh = static_cast<std::int64_t>(batch) * f.heads + head;
    const float* lse = f.lse + batch * f.lse_batch_stride + head * f.lse_head_stride;  // packed: [1, H, total_q]
    reinterpret_cast<float*>(smem + Cfg::kLseOff)[tid] = row < f.seq_q ? lse_log2(lse[row]) : INFINITY;
    reinterpret_cast<float*>(smem + Cfg::kDOff)[tid] = row < f.seq_q ? a.dsum[bh * a.rows_pad + row] : 0.f;
  }
}

// S = Q K^T and dP = dO V^T for this warp's 16 query rows, then P and
// dS = P (dP - D) in place of S and dP (f32, mma's C layout).
template <class Cfg, MaskMode kMask, Half16 Element>
__device__ __forceinline__ void scores_and_ds(const BwdArgs& a, const unsigned char* smem, int m0, int n0, int warp,
                                              int lane, float (&s)[1][Cfg::kBlockN / 8][4],
                                              float (&dp)[1][Cfg::kBlockN / 8][4]) {
  using QTile = typename Cfg::QTile;
  using KTile = typename Cfg::KTile;
  constexpr int kNT = Cfg::kBlockN / 8;
  const int row0 = warp * 16;
  zero(s);
  zero(dp);
  warp_gemm_ss<Element, QTile, KTile, false, false, 1, kNT, Cfg::kDSteps>(
      s, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kQOff), row0,
      reinterpret_cast<const std::uint16_t*>(smem + Cfg::kKOff), lane);
  warp_gemm_ss<Element, QTile, KTile, false, false, 1, kNT, Cfg::kDSteps>(
      dp, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kDoOff), row0,
      reinterpret_cast<const std::uint16_t*>(smem + Cfg::kVOff), lane);
  if (tile_needs_mask<kMask, Cfg::kBlockM, Cfg::kBlockN>(a.f, m0, n0)) {
    apply_mask<kMask>(s, a.f, m0 + row0 + lane / 4, n0 + 2 * (lane % 4));
  }
  const float* lse = reinterpret_cast<const float*>(smem + Cfg::kLseOff);
  const float* dsum = reinterpret_cast<const float*>(smem + Cfg::kDOff);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + lane / 4 + 8 * h;
    const float l = lse[r], d = dsum[r];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = ex2(fmaf(s[0][nt][2 * h + e], a.f.scale_log2, -l));
        s[0][nt][2 * h + e] = p;
        dp[0][nt][2 * h + e] = p * (dp[0][nt][2 * h + e] - d);
      }
    }
  }
}

// Writes this warp's 16 rows of a [query][key] f32 tile into a 16-bit PTile.
template <class PTile, Half16 Element, int kNT>
__device__ __forceinline__ void store_p_tile(std::uint16_t* smem, const float (&x)[1][kNT][4], int row0, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      *reinterpret_cast<std::uint32_t*>(smem + PTile::offset(row0 + g + 8 * h, nt * 8 + 2 * t)) =
          pack2<Element>(x[0][nt][2 * h], x[0][nt][2 * h + 1]);
    }
  }
}

}  // namespace attnprof::cuda::kernels
