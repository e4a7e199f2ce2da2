// Memory-efficient attention forward (the xformers / CUTLASS fMHA lineage):
// one fused kernel, 64x64 tiles whose S and O accumulators stay in registers,
// mma.sync on the tensor cores, and a plain pipeline: Q stays in shared memory
// and is re-read each key tile, K and V have one buffer each, and only the V
// copy overlaps the Q K^T product. Latency is hidden by running several light
// CTAs per multiprocessor rather than by prefetching inside one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/epilogue_fwd.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"
#include "backends/cuda/kernels/tile_scheduler.cuh"
#include "backends/cuda/kernels/warp_gemm_sm80.cuh"

namespace attnprof::cuda::kernels {

// 64 query rows = 4 warps x one 16-row m-tile: a thread holds O (D/2 f32),
// S (32 f32) and one k-step of Q (4 registers); at D = 64 that fits the
// 128-register cap of 4 CTAs a multiprocessor (shared memory: 27 KB a CTA).
constexpr int efficient_block_m(int /*head_dim*/) { return 64; }
// Keys per tile: 64 at D <= 64 (S: 32 f32 a thread). For D >= 96, O holds
// 48-128 f32 a thread and 32 keys ran faster (H200, D = 128 causal 8k:
// 2.49 ms vs 2.93 ms with 64 keys; at D = 256, 64 keys also spilled).
constexpr int efficient_block_n(int head_dim) { return head_dim <= 64 ? 64 : 32; }

// CTAs per multiprocessor the register cap must allow: the kernel hides load
// latency with other CTAs, so it asks for occupancy explicitly (without a
// minimum, ptxas picked 80-128 register targets on its own and spilled).
// D <= 64: 4 CTAs (cap 128 registers); D = 96, 128: 3 (cap 168); D = 256: 2.
constexpr int efficient_min_blocks(int head_dim) { return head_dim <= 64 ? 4 : head_dim <= 128 ? 3 : 2; }

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kMinBlocks_ = efficient_min_blocks(kHeadDim_)>
struct EfficientCfg : WarpTiling<kHeadDim_, kBlockM_, kBlockN_> {
  using Base = WarpTiling<kHeadDim_, kBlockM_, kBlockN_>;
  using typename Base::KVTile;
  using typename Base::QTile;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kKOffset = QTile::kBytes;
  static constexpr int kVOffset = kKOffset + KVTile::kBytes;
  static constexpr int kSmemBytes = kVOffset + KVTile::kBytes;
};

template <int kHeadDim>
using EfficientDefaultCfg = EfficientCfg<kHeadDim, efficient_block_m(kHeadDim), efficient_block_n(kHeadDim)>;

template <class Cfg, MaskMode kMask, Half16 Element, bool kLse>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    efficient_fwd_kernel(const __grid_constant__ FwdArgs a) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim, kT = Cfg::kThreads;
  using QTile = typename Cfg::QTile;
  using KVTile = typename Cfg::KVTile;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  std::uint16_t* const q_smem = reinterpret_cast<std::uint16_t*>(smem_raw);
  std::uint16_t* const k_smem = reinterpret_cast<std::uint16_t*>(smem_raw + Cfg::kKOffset);
  std::uint16_t* const v_smem = reinterpret_cast<std::uint16_t*>(smem_raw + Cfg::kVOffset);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const auto cta = StaticTileScheduler<kMask, kBM>::first(a);
  const int m0 = cta.m0;
  const std::uint16_t *q = cta.q(a), *k = cta.k(a), *v = cta.v(a);
  const int warp_row0 = warp * Cfg::kRowsPerWarp;

  float acc[Cfg::kMTiles][Cfg::kDTiles][4];
  zero(acc);
  OnlineSoftmax<Cfg::kMTiles> softmax;
  softmax.init();

  const KeyTiles tiles = key_tiles<kMask, kBM, kBN>(a, m0);
  if (tiles.begin < tiles.end) load_tile_async<kBM, kD, kT>(q_smem, q, a.q_row_stride, a.seq_q - m0, tid);
  for (int n_block = tiles.begin; n_block < tiles.end; ++n_block) {
    const int n0 = n_block * kBN;
    load_tile_async<kBN, kD, kT>(k_smem, k + n0 * a.k_row_stride, a.k_row_stride, a.seq_k - n0, tid);
    cp_async_commit();  // (Q and) K
    load_tile_async<kBN, kD, kT>(v_smem, v + n0 * a.v_row_stride, a.v_row_stride, a.seq_k - n0, tid);
    cp_async_commit();  // V
    cp_async_wait<1>();
    __syncthreads();

    float s[Cfg::kMTiles][Cfg::kNTiles][4];
    gemm_qk_smem<Element, QTile, KVTile, Cfg::kMTiles, Cfg::kNTiles, Cfg::kKSteps>(s, q_smem, warp_row0, k_smem, lane);
    if (tile_needs_mask<kMask, kBM, kBN>(a, m0, n0)) {
      apply_mask<kMask>(s, a, m0 + warp_row0 + lane / 4, n0 + 2 * (lane % 4));
    }
    softmax.template update</*kSkipUnchanged=*/true>(s, acc, a.scale_log2);

    cp_async_wait<0>();
    __syncthreads();
    gemm_pv<Element, KVTile>(acc, s, v_smem, lane);
    __syncthreads();  // K and V are refilled next iteration
  }

  // The O tile reuses Q's area: the last barrier above retired every Q read.
  EpilogueFwd<Element, kLse>::template store_staged<QTile, kT>(a, cta, q_smem, acc, softmax, warp_row0, lane, tid);
}

// kLse: the caller passes FwdArgs::lse (not null) and wants it written.
template <class Cfg, MaskMode kMask, Half16 Element, bool kLse = false>
cudaError_t run_efficient_fwd(const FwdArgs& a, cudaStream_t stream) {
  return launch_fwd<StaticTileScheduler<kMask, Cfg::kBlockM>>(efficient_fwd_kernel<Cfg, kMask, Element, kLse>,
                                                              Cfg::kThreads, Cfg::kSmemBytes, a, stream);
}

template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
cudaError_t launch_efficient_fwd(const FwdArgs& a, cudaStream_t stream) {
  return run_efficient_fwd<EfficientDefaultCfg<kHeadDim>, kMask, Element, kLse>(a, stream);
}

}  // namespace attnprof::cuda::kernels
