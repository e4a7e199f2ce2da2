// FlashAttention-2 class forward for sm80 and later (runs on sm90 too).
//
// One CTA of 4 warps per (query tile, head, batch); each warp owns
// 16*kMTiles query rows. Q lives in registers (or, where registers run out,
// in shared memory); K and V tiles stream through two shared-memory stages
// with cp.async, tile j-1 loading while tile j is computed. Key tiles run
// from the last visible one down, so a causal CTA meets its diagonal tiles
// first and never visits tiles past the diagonal; only tiles that contain a
// masked pair pay for per-element masking.
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

// Query rows per CTA. 128 rows (32 a warp, two m-tiles) halve the K/V
// shared-memory reads per matrix product: with one m-tile a warp, ldmatrix
// traffic (32 KB a warp per 64-key tile at D = 128) outruns the mma.sync rate
// (measured on H200, D = 128 causal: 64-row tiles 2.04 ms, 128-row 1.85 ms).
// At D = 256 two m-tiles of O alone would be 256 f32 a thread, so 64 rows.
constexpr int flash_block_m(int head_dim) { return head_dim <= 128 ? 128 : 64; }
// Keys per tile. D <= 64: 64 keys, S = 64 f32 a thread beside O (64) and Q (32):
// 128 keys would add 64 registers and spill. D = 128: 64 keys (S 64 f32 beside
// O's 128) fits in 255 registers once the tile loads keep one running pointer
// (tile_load_sm80.cuh); measured on H200 against 32 keys: 1.79 vs 1.82 ms causal
// 2x16x8192, 3.16-3.20 vs 3.26-3.30 ms non-causal, 3.40-3.42 vs 3.46-3.50 ms
// causal 1x16x16384 (docs/perf/fused-kernels.md, run 5). D = 96 keeps 32 keys
// (not re-measured). D = 256: O is 128 f32 for one m-tile; 32 keys.
constexpr int flash_block_n(int head_dim) { return head_dim <= 64 || head_dim == 128 ? 64 : 32; }
// Q fragments cost D/2 registers per m-tile. They fit at D <= 64 (32 registers);
// at D >= 96 they would push O + S + Q past 255, so Q is re-read from shared
// memory one k-step at a time (an extra ldmatrix per m-tile and k-step).
constexpr bool flash_q_in_regs(int head_dim) { return head_dim <= 64; }

// Skip the O rescale when no row max of the warp grew (OnlineSoftmax::update)?
// Measured on H200: with Q in registers and two m-tiles a warp (D <= 64) the
// skip's branch costs more than it saves (0.539 vs 0.508 ms, 4x16x4096x64
// causal); with one m-tile a warp, or with Q in shared memory at D = 128 where
// O is 128 f32 a thread, it is neutral to 3% faster (non-causal 8k: 3.25 vs 3.36 ms).
constexpr bool flash_skip_rescale(int block_m, bool q_in_regs) { return block_m == 64 || !q_in_regs; }

// Where in a key tile's iteration the next tile's cp.async copies are issued.
// After S = Q K^T, the Q and K fragments are dead and the copies' address
// registers do not compete with them; issued at the top of the iteration, the
// first ldmatrix of the tile waited on registers the copies were still reading
// (ncu: 4% of stall samples on one LDSM). Measured on H200, D = 128:
// 1.61-1.62 vs 1.73 ms causal 2x16x8192, 2.92 vs 3.16-3.17 ms non-causal,
// 3.10 vs 3.34-3.35 ms causal 1x16x16384 (docs/perf/fused-kernels.md, run 5).
enum class Prefetch : int { TileStart, AfterQK };

template <int kHeadDim_, int kBlockM_, int kBlockN_, bool kQInRegs_, int kMinBlocks_ = 1,
          bool kSkipRescale_ = flash_skip_rescale(kBlockM_, kQInRegs_), Prefetch kPrefetch_ = Prefetch::AfterQK>
struct FlashCfg : WarpTiling<kHeadDim_, kBlockM_, kBlockN_> {
  using Base = WarpTiling<kHeadDim_, kBlockM_, kBlockN_>;
  using typename Base::KVTile;
  using typename Base::QTile;
  static constexpr Prefetch kPrefetch = kPrefetch_;
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the register cap must allow
  static constexpr bool kSkipRescale = kSkipRescale_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kStageBytes = 2 * KVTile::kBytes;  // K then V
  // Q in registers: its staging tile reuses stage 1, free until the first prefetch.
  static constexpr int kQOffset = kQInRegs ? kStageBytes : 2 * kStageBytes;
  static constexpr int kSmemBytes =
      kQOffset + QTile::kBytes > 2 * kStageBytes ? kQOffset + QTile::kBytes : 2 * kStageBytes;
  static_assert(!kQInRegs || QTile::kBytes <= kStageBytes, "Q staging must fit in stage 1");
  static_assert(QTile::kBytes <= kSmemBytes, "the O tile is staged at offset 0");
};

template <int kHeadDim>
using FlashDefaultCfg = FlashCfg<kHeadDim, flash_block_m(kHeadDim), flash_block_n(kHeadDim), flash_q_in_regs(kHeadDim)>;

template <class Cfg, MaskMode kMask, Half16 Element, bool kLse>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    flash_fwd_sm80_kernel(const __grid_constant__ FwdArgs args) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim, kT = Cfg::kThreads;
  using QTile = typename Cfg::QTile;
  using KVTile = typename Cfg::KVTile;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto kv_smem = [&](int stage, int which) {  // which: 0 = K, 1 = V
    return reinterpret_cast<std::uint16_t*>(smem_raw + stage * Cfg::kStageBytes + which * KVTile::kBytes);
  };
  std::uint16_t* const q_smem = reinterpret_cast<std::uint16_t*>(smem_raw + Cfg::kQOffset);
  std::uint16_t* const o_smem = reinterpret_cast<std::uint16_t*>(smem_raw);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const auto cta = StaticTileScheduler<kMask, kBM>::first(args);
  // The tile's sequence (packed batches, key counts; args itself when dense):
  // its rows, lengths and mask diagonal; a tile past its rows has no key tiles.
  const FwdArgs a = args.sequence(cta.batch);
  const int m0 = cta.m0;
  const int warp_row0 = warp * Cfg::kRowsPerWarp;

  const TileStream<kBN, kD, kT> k_stream(cta.k(a), a.k_row_stride, tid), v_stream(cta.v(a), a.v_row_stride, tid);
  auto load_kv = [&](int stage, int n_block) {
    const int n0 = n_block * kBN;
    k_stream.load(kv_smem(stage, 0), n0, a.seq_k - n0, a.k, tid);
    v_stream.load(kv_smem(stage, 1), n0, a.seq_k - n0, a.v, tid);
  };

  float acc[Cfg::kMTiles][Cfg::kDTiles][4];
  zero(acc);
  OnlineSoftmax<Cfg::kMTiles> softmax;
  softmax.init();

  const KeyTiles tiles = key_tiles<kMask, kBM, kBN>(a, m0);
  if (tiles.begin < tiles.end) {
    load_tile_async<kBM, kD, kT>(q_smem, cta.q(a), a.q_row_stride, a.seq_q - m0, tid);
    load_kv(0, tiles.end - 1);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    [[maybe_unused]] std::uint32_t q_frag[Cfg::kQInRegs ? Cfg::kMTiles : 1][Cfg::kQInRegs ? Cfg::kKSteps : 1][4];
    if constexpr (Cfg::kQInRegs) {
      load_q_fragments<QTile>(q_frag, q_smem, warp_row0, lane);
      __syncthreads();  // stage 1 (Q's staging area) is overwritten by the first prefetch
    }

    for (int it = 0, n_block = tiles.end - 1; n_block >= tiles.begin; ++it, --n_block) {
      const int stage = it & 1;
      // The other stage was freed by the barrier that ended the last iteration.
      const bool more = n_block > tiles.begin;
      if (Cfg::kPrefetch == Prefetch::TileStart && more) load_kv(stage ^ 1, n_block - 1);

      float s[Cfg::kMTiles][Cfg::kNTiles][4];
      if constexpr (Cfg::kQInRegs) {
        gemm_qk<Element, KVTile>(s, q_frag, kv_smem(stage, 0), lane);
      } else {
        gemm_qk_smem<Element, QTile, KVTile, Cfg::kMTiles, Cfg::kNTiles, Cfg::kKSteps>(s, q_smem, warp_row0,
                                                                                       kv_smem(stage, 0), lane);
      }
      if (Cfg::kPrefetch == Prefetch::AfterQK && more) load_kv(stage ^ 1, n_block - 1);
      cp_async_commit();
      const int n0 = n_block * kBN;
      if (tile_needs_mask<kMask, kBM, kBN>(a, m0, n0)) {
        apply_mask<kMask>(s, a, m0 + warp_row0 + lane / 4, n0 + 2 * (lane % 4));
      }
      softmax.template update<Cfg::kSkipRescale>(s, acc, a.scale_log2);
      gemm_pv<Element, KVTile>(acc, s, kv_smem(stage, 1), lane);

      cp_async_wait<0>();  // the next tile has landed ...
      __syncthreads();     // ... for every thread, and this stage is free to refill
    }
  }

  EpilogueFwd<Element, kLse>::template store_staged<QTile, kT>(a, cta, o_smem, acc, softmax, warp_row0, lane, tid);
  // A dense batch's query rows: the tensor tile's rows outside the sequence's.
  if (args.q_spans != nullptr) zero_query_rows_outside<kLse, kBM, kD>(args, a, cta, tid, kT);
}

// kLse: the caller passes FwdArgs::lse (not null) and wants it written.
template <class Cfg, MaskMode kMask, Half16 Element, bool kLse = false>
cudaError_t run_flash_fwd_sm80(const FwdArgs& a, cudaStream_t stream) {
  return launch_fwd<StaticTileScheduler<kMask, Cfg::kBlockM>>(flash_fwd_sm80_kernel<Cfg, kMask, Element, kLse>,
                                                              Cfg::kThreads, Cfg::kSmemBytes, a, stream);
}

template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
cudaError_t launch_flash_fwd_sm80(const FwdArgs& a, cudaStream_t stream) {
  return run_flash_fwd_sm80<FlashDefaultCfg<kHeadDim>, kMask, Element, kLse>(a, stream);
}

}  // namespace attnprof::cuda::kernels
