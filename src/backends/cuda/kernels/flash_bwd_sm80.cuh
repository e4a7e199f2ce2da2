// FlashAttention-2 class backward for sm80 and later (mma.sync; sm90 runs it
// too), serving both fused backends. Three kernels a call:
//   1. bwd_preprocess: D_i = rowsum(dO_i * O_i) (FP32 [B, H, Sq]), and the
//      FP32 dQ accumulator zeroed (no cudaMemset);
//   2. bwd_dkdv: one CTA per (key tile, kv head, batch) walks the query tiles
//      that see its keys, for every query head of its grouped-query group, so
//      dK and dV are summed in registers (no atomics for them). Per query tile
//      it recomputes P = exp(scale Q K^T - LSE) from the forward's saved LSE,
//      then dV += P^T dO, dP = dO V^T, dS = P (dP - D), dK += dS^T Q, and (not
//      deterministic) dQ += dS K with FP32 atomicAdd into the accumulator;
//   3. bwd_convert_dq: the accumulator (already scaled) to the element type.
// Deterministic (FusedBwdParams::deterministic): kernel 2 skips dQ, and
// kernel 3 is bwd_dq instead: one CTA per (query tile, head, batch) loops
// over its visible key tiles in a fixed order, recomputing P and dS, and
// writes dQ once; no atomics anywhere, so two runs give identical bits.
//
// Every product runs on mma.m16n8k16 with both operands read from padded
// shared tiles through ldmatrix (warp_gemm_sm80.cuh's warp_gemm_ss), so one
// routine serves the five products whatever their operands' layouts; P and dS
// go through shared memory as 16-bit tiles. A fully masked row has LSE +inf
// (the forward's convention; -inf or NaN are taken the same way): its P is 0,
// so it adds nothing to dK and dV and gets dQ = 0; keys no query sees get
// dK = dV = 0.
//
// This file lays out shared memory (BwdCfg) and the two tile kernels; the
// roles live in
//   bwd_args.cuh               BwdArgs, from FusedBwdParams in one place
//   flash_bwd_preprocess.cuh   kernel 1
//   mainloop_bwd_sm80.cuh      one (query tile, key tile) pair: loads, P, dS
//   epilogue_bwd_sm80.cuh      dK, dV, dQ out of registers (or dQ by atomics)
//   flash_bwd_postprocess.cuh  kernel 3 (atomic dQ)
//   bwd_launch.cuh             launch_flash_bwd_sm80's declaration and instances
//
// Measured on H200 (attnprof profile --backend flash --pass backward, 8x16x1024x64
// causal bf16): 459 us a call, about 94 TFLOP/s: preprocess 42 us, dK/dV with
// atomic dQ 359 us (166 registers, 54 KiB shared: 19% occupancy), dQ
// conversion 57 us. Not tuned yet: preprocess and conversion are scalar
// (16-byte loads would cut both), and the main loop neither double-buffers Q/dO
// nor keeps P and dS in registers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/bwd_launch.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/epilogue_bwd_sm80.cuh"
#include "backends/cuda/kernels/flash_bwd_postprocess.cuh"
#include "backends/cuda/kernels/flash_bwd_preprocess.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/kernels/mainloop_bwd_sm80.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/warp_gemm_sm80.cuh"

namespace attnprof::cuda::kernels {

// Tiles and shared-memory plan of the backward's two tile kernels: 64 query
// rows by 64 keys, 4 warps; in the query-row products each warp owns 16 query
// rows, in dK and dV 16 keys.
template <int kHeadDim_>
struct BwdCfg {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kDSteps = kHeadDim / 16;
  using QTile = SmemTile<kBlockM, kHeadDim>;  // Q and dO
  using KTile = SmemTile<kBlockN, kHeadDim>;  // K and V
  using PTile = SmemTile<kBlockM, kBlockN>;   // P and dS, [query][key]
  static constexpr int kQOff = 0;
  static constexpr int kDoOff = kQOff + QTile::kBytes;
  static constexpr int kKOff = kDoOff + QTile::kBytes;
  static constexpr int kVOff = kKOff + KTile::kBytes;
  static constexpr int kPOff = kVOff + KTile::kBytes;
  static constexpr int kDsOff = kPOff + PTile::kBytes;
  static constexpr int kLseOff = kDsOff + PTile::kBytes;
  static constexpr int kDOff = kLseOff + kBlockM * 4;
  static constexpr int kSmemBytes = kDOff + kBlockM * 4;
  static_assert(kBlockM == 16 * kWarps && kBlockN == 16 * kWarps, "a warp owns 16 rows of each side");
};

// dK and dV of one key tile (and dQ by atomics unless kDeterministic).
template <class Cfg, MaskMode kMask, Half16 Element, bool kDeterministic>
__global__ void __launch_bounds__(Cfg::kThreads) flash_bwd_dkdv_kernel(const __grid_constant__ BwdArgs args) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim, kT = Cfg::kThreads;
  constexpr int kNT = kBN / 8, kDT = Cfg::kDTiles;
  using QTile = typename Cfg::QTile;
  using KTile = typename Cfg::KTile;
  using PTile = typename Cfg::PTile;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = blockIdx.x * kBN, kv_head = blockIdx.y, batch = blockIdx.z;
  // The CTA's sequence (packed batches, key counts; args itself when dense):
  // its key tiles past the sequence's keys have no query tiles.
  const BwdArgs a = args.sequence(batch);
  const FwdArgs& f = a.f;
  std::uint16_t* const p_s = reinterpret_cast<std::uint16_t*>(smem + Cfg::kPOff);
  std::uint16_t* const ds_s = reinterpret_cast<std::uint16_t*>(smem + Cfg::kDsOff);

  const std::uint16_t* k = f.k + batch * f.k_batch_stride + kv_head * f.k_head_stride + n0 * f.k_row_stride;
  const std::uint16_t* v = f.v + batch * f.v_batch_stride + kv_head * f.v_head_stride + n0 * f.v_row_stride;
  load_tile_async<kBN, kD, kT>(reinterpret_cast<std::uint16_t*>(smem + Cfg::kKOff), k, f.k_row_stride, f.seq_k - n0,
                               tid);
  load_tile_async<kBN, kD, kT>(reinterpret_cast<std::uint16_t*>(smem + Cfg::kVOff), v, f.v_row_stride, f.seq_k - n0,
                               tid);
  cp_async_commit();

  float dk[1][kDT][4], dv[1][kDT][4];
  zero(dk);
  zero(dv);
  const QueryTiles tiles = query_tiles<kMask, kBM, kBN>(f, n0);

  for (int g = 0; g < f.group; ++g) {
    const int head = kv_head * f.group + g;
    for (int m_block = tiles.begin; m_block < tiles.end; ++m_block) {
      const int m0 = m_block * kBM;
      load_query_tile<Cfg>(a, smem, batch, head, m0, tid);
      cp_async_wait<0>();
      __syncthreads();

      float s[1][kNT][4], ds[1][kNT][4];
      scores_and_ds<Cfg, kMask, Element>(a, smem, m0, n0, warp, lane, s, ds);
      store_p_tile<PTile, Element>(p_s, s, warp * 16, lane);
      store_p_tile<PTile, Element>(ds_s, ds, warp * 16, lane);
      __syncthreads();

      // This warp's 16 keys: dV += P^T dO, dK += dS^T Q (k = the tile's query rows).
      warp_gemm_ss<Element, PTile, QTile, true, true, 1, kDT, kBM / 16>(
          dv, p_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kDoOff), lane);
      warp_gemm_ss<Element, PTile, QTile, true, true, 1, kDT, kBM / 16>(
          dk, ds_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kQOff), lane);
      if constexpr (!kDeterministic) {
        // This warp's 16 query rows: dQ += scale dS K, added into the FP32 accumulator.
        float dq[1][kDT][4];
        zero(dq);
        warp_gemm_ss<Element, PTile, KTile, false, true, 1, kDT, kBN / 16>(
            dq, ds_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kKOff), lane);
        add_dq_atomic<kD>(a, dq, batch, head, m0 + warp * 16, lane);
      }
      __syncthreads();  // Q, dO, P, dS are refilled by the next tile
    }
  }
  cp_async_wait<0>();  // K and V, when no query tile was visited

  // The sequence's keys; a dense batch's rows outside them get their zeros
  // from the tile of the tensor that holds them (as epilogue_bwd_sm90.cuh's store_dkdv).
  store_rows<Element>(a.dk + batch * a.dk_batch_stride + kv_head * a.dk_head_stride + n0 * a.dk_row_stride,
                      a.dk_row_stride, dk, a.scale, warp * 16, f.seq_k - n0, lane);
  store_rows<Element>(a.dv + batch * a.dv_batch_stride + kv_head * a.dv_head_stride + n0 * a.dv_row_stride,
                      a.dv_row_stride, dv, 1.f, warp * 16, f.seq_k - n0, lane);
  args.zero_dkdv_rows_outside(a, batch, kv_head, n0, kBN, tid, kT);
}

// Deterministic dQ of one query tile: its visible key tiles in one fixed
// order (first to last), recomputing P and dS; dQ written once, no atomics.
template <class Cfg, MaskMode kMask, Half16 Element>
__global__ void __launch_bounds__(Cfg::kThreads) flash_bwd_dq_kernel(const __grid_constant__ BwdArgs args) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim, kT = Cfg::kThreads;
  constexpr int kNT = kBN / 8, kDT = Cfg::kDTiles;
  using KTile = typename Cfg::KTile;
  using PTile = typename Cfg::PTile;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = blockIdx.x * kBM, head = blockIdx.y, batch = blockIdx.z;
  const BwdArgs a = args.sequence(batch);  // its query tiles past the sequence's rows have no key tiles
  const FwdArgs& f = a.f;
  const int kv_head = head / f.group;
  std::uint16_t* const ds_s = reinterpret_cast<std::uint16_t*>(smem + Cfg::kDsOff);

  load_query_tile<Cfg>(a, smem, batch, head, m0, tid);
  float dq[1][kDT][4];
  zero(dq);
  const KeyTiles key_range = key_tiles<kMask, kBM, kBN>(f, m0);
  const std::uint16_t* k = f.k + batch * f.k_batch_stride + kv_head * f.k_head_stride;
  const std::uint16_t* v = f.v + batch * f.v_batch_stride + kv_head * f.v_head_stride;
  for (int n_block = key_range.begin; n_block < key_range.end; ++n_block) {
    const int n0 = n_block * kBN;
    load_tile_async<kBN, kD, kT>(reinterpret_cast<std::uint16_t*>(smem + Cfg::kKOff), k + n0 * f.k_row_stride,
                                 f.k_row_stride, f.seq_k - n0, tid);
    load_tile_async<kBN, kD, kT>(reinterpret_cast<std::uint16_t*>(smem + Cfg::kVOff), v + n0 * f.v_row_stride,
                                 f.v_row_stride, f.seq_k - n0, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[1][kNT][4], ds[1][kNT][4];
    scores_and_ds<Cfg, kMask, Element>(a, smem, m0, n0, warp, lane, s, ds);
    store_p_tile<PTile, Element>(ds_s, ds, warp * 16, lane);
    __syncwarp();  // a warp reads back only its own rows of dS
    warp_gemm_ss<Element, PTile, KTile, false, true, 1, kDT, kBN / 16>(
        dq, ds_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kKOff), lane);
    __syncthreads();  // K, V and dS are refilled by the next tile
  }
  cp_async_wait<0>();  // Q and dO, when no key tile was visited
  store_rows<Element>(a.dq + batch * a.dq_batch_stride + head * a.dq_head_stride + m0 * a.dq_row_stride,
                      a.dq_row_stride, dq, a.scale, warp * 16, f.seq_q - m0, lane);
  args.zero_dq_rows_outside(a, batch, head, m0, kBM, tid, kT);  // a dense batch's rows outside the sequence's
}

// The three kernels of one backward on `stream`.
template <int kHeadDim, MaskMode kMask, Half16 Element>
cudaError_t launch_flash_bwd_sm80(const BwdArgs& a, cudaStream_t stream) {
  using Cfg = BwdCfg<kHeadDim>;
  const FwdArgs& f = a.f;
  const bool deterministic = a.deterministic;
  if (const cudaError_t err = launch_bwd_preprocess<Element>(a, stream); err != cudaSuccess) return err;

  const dim3 kv_grid((f.seq_k + Cfg::kBlockN - 1) / Cfg::kBlockN, f.heads / f.group, f.batch);
  if (deterministic) {
    auto* dkdv = flash_bwd_dkdv_kernel<Cfg, kMask, Element, true>;
    if (const cudaError_t err = opt_in_shared_memory(dkdv, Cfg::kSmemBytes); err != cudaSuccess) return err;
    dkdv<<<kv_grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    auto* dq = flash_bwd_dq_kernel<Cfg, kMask, Element>;
    if (const cudaError_t err = opt_in_shared_memory(dq, Cfg::kSmemBytes); err != cudaSuccess) return err;
    const dim3 q_grid((f.seq_q + Cfg::kBlockM - 1) / Cfg::kBlockM, f.heads, f.batch);
    dq<<<q_grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
    return cudaGetLastError();
  }
  auto* dkdv = flash_bwd_dkdv_kernel<Cfg, kMask, Element, false>;
  if (const cudaError_t err = opt_in_shared_memory(dkdv, Cfg::kSmemBytes); err != cudaSuccess) return err;
  dkdv<<<kv_grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  return launch_bwd_convert_dq<Element>(a, stream);
}

}  // namespace attnprof::cuda::kernels
