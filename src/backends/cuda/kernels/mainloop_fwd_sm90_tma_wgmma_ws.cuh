// The key loop of flash's sm90a forward, split by role (warp specialised):
//   load: the producer thread brings Q once a tile, then K and V key tile after
//         key tile, with TMA into the stages of a PipelineTmaAsync;
//   mma:  each consumer warpgroup, for its 64 query rows: S = Q K^T with both
//         operands in shared memory (wgmma SS), the mask and online softmax in
//         registers, O += P V with P straight from the S registers (wgmma RS).
// Q, K and V sit in the 128-byte-swizzled layout that TMA writes and wgmma
// reads (wgmma_sm90.cuh). Key tiles run from the last visible one down, as in
// the sm80 kernel, so a causal tile meets its diagonal first.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/pipeline_sm90.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"
#include "backends/cuda/kernels/tma_sm90.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/wgmma_sm90.cuh"

namespace attnprof::cuda::kernels {

// Tile sizes of the sm90a forward: 64 query rows per consumer warpgroup
// (kConsumers of them), kBlockN keys a tile, kStages K/V stages. Measured on
// H200 (docs/perf/fused-kernels.md, run 8): a third stage and the rescale skip
// are within run-to-run spread of the default (2 consumers, 2 stages); three
// consumers gain 4% at 4096x64, lose 7% at 1024x64, and at D = 128 the 416
// threads cap ptxas at 128 registers, spill 1.1 KB and run at a third of the
// speed (setmaxnreg would be needed there).
template <int kHeadDim_, int kBlockN_, int kConsumers_ = 2, int kStages_ = 2, bool kSkipRescale_ = false>
struct FlashSm90Cfg {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumers = kConsumers_;  // warpgroups of 64 query rows
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + 32;  // and one producer warp
  static constexpr int kStages = kStages_;
  static constexpr bool kSkipRescale = kSkipRescale_;  // OnlineSoftmax::update's
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static_assert(kHeadDim % 64 == 0, "whole 128-byte swizzle regions");
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N of S: 64 or 128");
  static_assert(kDTiles == 8 || kDTiles == 16, "wgmma N of O: 64 or 128");
};

template <int kHeadDim>
using FlashSm90DefaultCfg = FlashSm90Cfg<kHeadDim, 128>;

template <class Cfg, MaskMode kMask, Half16 Element>
struct MainloopFwdSm90TmaWgmmaWs {
  static constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  static constexpr int kNT = Cfg::kNTiles, kDT = Cfg::kDTiles, kRegions = kD / 64;
  static constexpr int kQBytes = kBM * kD * 2;
  static constexpr int kKVBytes = kBN * kD * 2;
  // Q, then K and V of each stage; every region 1024-byte aligned (the swizzle's period).
  static constexpr int kSmemBytes = kQBytes + Cfg::kStages * 2 * kKVBytes;

  using QPipeline = sm90::PipelineTmaAsync<1>;
  using KVPipeline = sm90::PipelineTmaAsync<Cfg::kStages, 2>;  // parts: K, then V
  static constexpr int kPartK = 0, kPartV = 1;

  // Device-side params: TMA descriptors of Q, K and V as 4-d tensors (column,
  // row, head, batch), in boxes of 64 columns (one swizzle region) by a tile's rows.
  struct Params {
    CUtensorMap q, k, v;
  };

  // The descriptors of a tensor set: encoded on its first call and kept (a
  // few sets a thread), since three cuTensorMapEncodeTiled calls cost more
  // host time than the rest of a launch. A descriptor holds only the address,
  // sizes and strides, all in the key, so a hit is the same descriptor.
  static cudaError_t to_params(const FwdArgs& a, Params& p) {
    const sm90::MapKey key{{a.q, a.k, a.v},
                           {a.q_batch_stride, a.q_head_stride, a.q_row_stride, a.k_batch_stride, a.k_head_stride,
                            a.k_row_stride, a.v_batch_stride, a.v_head_stride, a.v_row_stride},
                           {a.seq_q, a.seq_k, a.heads, a.group, a.batch}};
    thread_local sm90::MapCache<Params> cache;
    if (const Params* hit = cache.find(key)) {
      p = *hit;
      return cudaSuccess;
    }
    const int kv_heads = a.heads / a.group;
    for (const cudaError_t e : {
             sm90::make_map<Element>(p.q, a.q, kD, a.seq_q, a.heads, a.batch, a.q_row_stride, a.q_head_stride,
                                     a.q_batch_stride, kBM),
             sm90::make_map<Element>(p.k, a.k, kD, a.seq_k, kv_heads, a.batch, a.k_row_stride, a.k_head_stride,
                                     a.k_batch_stride, kBN),
             sm90::make_map<Element>(p.v, a.v, kD, a.seq_k, kv_heads, a.batch, a.v_row_stride, a.v_head_stride,
                                     a.v_batch_stride, kBN),
         }) {
      if (e != cudaSuccess) return e;
    }
    cache.insert(key, p);
    return cudaSuccess;
  }

  // The shared buffers, from their 1024-byte aligned base.
  struct Smem {
    std::uint32_t base;
    __device__ __forceinline__ std::uint32_t q() const { return base; }
    __device__ __forceinline__ std::uint32_t k(int stage) const { return base + kQBytes + stage * 2 * kKVBytes; }
    __device__ __forceinline__ std::uint32_t v(int stage) const { return k(stage) + kKVBytes; }
  };

  // Producer (one thread): Q of the tile, then its key tiles [tiles.begin, tiles.end) last first.
  template <class Tile>
  __device__ __forceinline__ static void load(const Params& p, const Smem& smem, const Tile& cta, KeyTiles tiles,
                                              const QPipeline& q_pipe, const typename QPipeline::State& q_state,
                                              const KVPipeline& kv_pipe, typename KVPipeline::State& kv_state) {
    const std::uint32_t q_bar = q_pipe.producer_expect(q_state, 0, kQBytes);
    for (int r = 0; r < kRegions; ++r) {
      sm90::tma_load_4d(smem.q() + r * kBM * 128, &p.q, q_bar, 64 * r, cta.m0, cta.head, cta.batch);
    }
    for (int n_block = tiles.end - 1; n_block >= tiles.begin; --n_block) {
      kv_pipe.producer_acquire(kv_state);  // both consumers are done with the stage's last tile
      const int n0 = n_block * kBN, stage = kv_state.index();
      const std::uint32_t k_bar = kv_pipe.producer_expect(kv_state, kPartK, kKVBytes);
      for (int r = 0; r < kRegions; ++r) {
        sm90::tma_load_4d(smem.k(stage) + r * kBN * 128, &p.k, k_bar, 64 * r, n0, cta.kv_head, cta.batch);
      }
      const std::uint32_t v_bar = kv_pipe.producer_expect(kv_state, kPartV, kKVBytes);
      for (int r = 0; r < kRegions; ++r) {
        sm90::tma_load_4d(smem.v(stage) + r * kBN * 128, &p.v, v_bar, 64 * r, n0, cta.kv_head, cta.batch);
      }
      kv_state.advance();
    }
  }

  // Consumer warpgroup wg: its 64 rows of the tile against every key tile,
  // into acc (O, unnormalised) and softmax. warp_row0: this warp's first row.
  template <class Tile>
  __device__ __forceinline__ static void mma(const FwdArgs& a, const Smem& smem, const Tile& cta, KeyTiles tiles,
                                             const QPipeline& q_pipe, const typename QPipeline::State& q_state,
                                             const KVPipeline& kv_pipe, typename KVPipeline::State& kv_state,
                                             float (&acc)[1][kDT][4], OnlineSoftmax<1>& softmax, int wg, int warp_row0,
                                             int lane) {
    q_pipe.consumer_wait(q_state);
    for (int n_block = tiles.end - 1; n_block >= tiles.begin; --n_block) {
      const int stage = kv_state.index();
      // S = Q K^T: this warpgroup's 64 rows of Q against the key tile, K-major.
      float s[1][kNT][4];
      zero(s);
      kv_pipe.consumer_wait(kv_state, kPartK);
      sm90::fence_operands(s[0]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const std::uint32_t q_at = smem.q() + (kk / 4) * kBM * 128 + wg * 64 * 128 + (kk % 4) * 32;
        const std::uint32_t k_at = smem.k(stage) + (kk / 4) * kBN * 128 + (kk % 4) * 32;
        sm90::wgmma_ss<Element, kNT>(s[0], sm90::smem_desc(q_at, 0), sm90::smem_desc(k_at, 0), kk > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_operands(s[0]);

      const int n0 = n_block * kBN;
      if (tile_needs_mask<kMask, kBM, kBN>(a, cta.m0, n0)) {
        apply_mask<kMask>(s, a, cta.m0 + warp_row0 + lane / 4, n0 + 2 * (lane % 4));
      }
      softmax.template update<Cfg::kSkipRescale>(s, acc, a.scale_log2);

      // O += P V: P from the S registers (16 keys a step), V read MN-major.
      std::uint32_t p[kNT / 2][4];
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) pack_p<Element>(p[kk], s[0], kk);
      kv_pipe.consumer_wait(kv_state, kPartV);
      sm90::fence_operands(acc[0]);
      sm90::fence_operands(p);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        const std::uint32_t v_at = smem.v(stage) + kk * 16 * 128;
        sm90::wgmma_rs<Element, kDT>(acc[0], p[kk], sm90::smem_desc(v_at, kBN * 128), true);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_operands(acc[0]);
      sm90::fence_operands(p);
      kv_pipe.consumer_release(kv_state);
      kv_state.advance();
    }
  }
};

}  // namespace attnprof::cuda::kernels
