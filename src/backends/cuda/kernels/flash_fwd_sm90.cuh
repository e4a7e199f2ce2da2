// FlashAttention forward on sm90a: TMA loads, wgmma, a producer warp and two
// consumer warpgroups that run free of each other.
//
// One CTA per (128-row query tile, head, batch), as FlashSm90Cfg has it by
// default (kConsumers sets the consumer count). Warp 8 is the producer: one
// thread loads Q once and then K and V tile after tile with TMA into two
// shared-memory stages, each stage guarded by mbarriers ("full" when its bytes
// have landed, "empty" when both consumers are done with it). Warpgroups 0
// and 1 are the consumers, each owning 64 query rows: S = Q K^T with both
// operands in shared memory, the mask and online softmax in registers, and
// O += P V with P straight from the S registers. Nothing makes the two
// consumers wait for each other, so one's softmax runs under the other's
// matrix products. Q, K and V sit in the 128-byte-swizzled layout that TMA
// writes and wgmma reads (wgmma_sm90.cuh).
//
// Not yet in: the consumers' own softmax overlapped with their next S
// (FlashAttention-3's intra-warpgroup pipelining: tried, and slower without
// setmaxnreg, docs/perf/fused-kernels.md run 9), setmaxnreg.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/mma_sm80.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"
#include "backends/cuda/kernels/warp_gemm_sm80.cuh"
#include "backends/cuda/kernels/wgmma_sm90.cuh"

namespace attnprof::cuda::kernels {

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
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kDataBytes = kQBytes + kStages * 2 * kKVBytes;
  static constexpr int kBarriers = 1 + 3 * kStages;  // full Q; full K, full V, empty per stage
  // 1024 bytes of slack: the swizzled regions must start 1024-byte aligned.
  static constexpr int kSmemBytes = kDataBytes + 8 * kBarriers + 1024;
  static_assert(kHeadDim % 64 == 0, "whole 128-byte swizzle regions");
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N of S: 64 or 128");
  static_assert(kDTiles == 8 || kDTiles == 16, "wgmma N of O: 64 or 128");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 CTA may have");
};

template <int kHeadDim>
using FlashSm90DefaultCfg = FlashSm90Cfg<kHeadDim, 128>;

// TMA descriptors of Q, K and V as 4-d tensors (column, row, head, batch), in
// boxes of 64 columns (one swizzle region) by a tile's rows.
struct FlashSm90Maps {
  CUtensorMap q, k, v;
};

template <class Cfg, MaskMode kMask, bool kBf16>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ FwdArgs a, const __grid_constant__ FlashSm90Maps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  constexpr int kNT = Cfg::kNTiles, kDT = Cfg::kDTiles, kRegions = kD / 64;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // aligned to 1024 below
  const std::uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const std::uint32_t q_s = base;
  auto k_s = [&](int stage) { return base + Cfg::kQBytes + stage * 2 * Cfg::kKVBytes; };
  auto v_s = [&](int stage) { return k_s(stage) + Cfg::kKVBytes; };
  const std::uint32_t bars = base + Cfg::kDataBytes;
  const std::uint32_t full_q = bars;
  auto full_k = [&](int stage) { return bars + 8 * (1 + stage); };
  auto full_v = [&](int stage) { return bars + 8 * (1 + Cfg::kStages + stage); };
  auto empty = [&](int stage) { return bars + 8 * (1 + 2 * Cfg::kStages + stage); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    sm90::mbar_init(full_q, 1);
    for (int st = 0; st < Cfg::kStages; ++st) {
      sm90::mbar_init(full_k(st), 1);
      sm90::mbar_init(full_v(st), 1);
      sm90::mbar_init(empty(st), Cfg::kConsumerThreads);
    }
    sm90::mbar_fence_init();
  }
  __syncthreads();

  const CtaTile<kMask, kBM> cta(a);
  const int m0 = cta.m0;
  const KeyTiles tiles = key_tiles<kMask, kBM, kBN>(a, m0);

  if (warp == Cfg::kConsumerThreads / 32) {  // the producer
    if (lane == 0 && tiles.begin < tiles.end) {
      sm90::mbar_expect_tx(full_q, Cfg::kQBytes);
      for (int r = 0; r < kRegions; ++r) {
        sm90::tma_load_4d(q_s + r * kBM * 128, &maps.q, full_q, 64 * r, m0, cta.head, cta.batch);
      }
      for (int it = 0, n_block = tiles.end - 1; n_block >= tiles.begin; ++it, --n_block) {
        const int stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
        sm90::mbar_wait(empty(stage), phase ^ 1);  // both consumers are done with its last tile
        const int n0 = n_block * kBN;
        sm90::mbar_expect_tx(full_k(stage), Cfg::kKVBytes);
        for (int r = 0; r < kRegions; ++r) {
          sm90::tma_load_4d(k_s(stage) + r * kBN * 128, &maps.k, full_k(stage), 64 * r, n0, cta.kv_head, cta.batch);
        }
        sm90::mbar_expect_tx(full_v(stage), Cfg::kKVBytes);
        for (int r = 0; r < kRegions; ++r) {
          sm90::tma_load_4d(v_s(stage) + r * kBN * 128, &maps.v, full_v(stage), 64 * r, n0, cta.kv_head, cta.batch);
        }
      }
    }
    return;
  }

  const int wg = warp / 4;
  const int warp_row0 = wg * 64 + (warp % 4) * 16;  // this warp's first row of the query tile
  float acc[1][kDT][4];
  zero(acc);
  OnlineSoftmax<1> softmax;
  softmax.init();

  if (tiles.begin < tiles.end) {
    sm90::mbar_wait(full_q, 0);
    for (int it = 0, n_block = tiles.end - 1; n_block >= tiles.begin; ++it, --n_block) {
      const int stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      // S = Q K^T: this warpgroup's 64 rows of Q against the key tile, K-major.
      float s[1][kNT][4];
      zero(s);
      sm90::mbar_wait(full_k(stage), phase);
      sm90::fence_operands(s[0]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const std::uint32_t q_at = q_s + (kk / 4) * kBM * 128 + wg * 64 * 128 + (kk % 4) * 32;
        const std::uint32_t k_at = k_s(stage) + (kk / 4) * kBN * 128 + (kk % 4) * 32;
        sm90::wgmma_ss<kBf16, kNT>(s[0], sm90::smem_desc(q_at, 0), sm90::smem_desc(k_at, 0), kk > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_operands(s[0]);

      const int n0 = n_block * kBN;
      if (tile_needs_mask<kMask, kBM, kBN>(a, m0, n0)) {
        apply_mask<kMask>(s, a, m0 + warp_row0 + lane / 4, n0 + 2 * (lane % 4));
      }
      softmax.template update<Cfg::kSkipRescale>(s, acc, a.scale_log2);

      // O += P V: P from the S registers (16 keys a step), V read MN-major.
      std::uint32_t p[kNT / 2][4];
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        p[kk][0] = pack_half2<kBf16>(s[0][2 * kk][0], s[0][2 * kk][1]);
        p[kk][1] = pack_half2<kBf16>(s[0][2 * kk][2], s[0][2 * kk][3]);
        p[kk][2] = pack_half2<kBf16>(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
        p[kk][3] = pack_half2<kBf16>(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
      }
      sm90::mbar_wait(full_v(stage), phase);
      sm90::fence_operands(acc[0]);
      sm90::fence_operands(p);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        const std::uint32_t v_at = v_s(stage) + kk * 16 * 128;
        sm90::wgmma_rs<kBf16, kDT>(acc[0], p[kk], sm90::smem_desc(v_at, kBN * 128), true);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_operands(acc[0]);
      sm90::fence_operands(p);
      sm90::mbar_arrive(empty(stage));
    }
  }

  // O / rowsum straight from the registers: two 16-bit values a store.
  float inv[1][2];
  softmax.finish(inv);
  std::uint16_t* const o = cta.o(a);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp_row0 + g + 8 * h;
    if (m0 + row >= a.seq_q) continue;
    std::uint16_t* const o_row = o + row * a.o_row_stride;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      *reinterpret_cast<std::uint32_t*>(o_row + dt * 8 + 2 * t) =
          pack_half2<kBf16>(acc[0][dt][2 * h] * inv[0][h], acc[0][dt][2 * h + 1] * inv[0][h]);
    }
  }
#endif
}

namespace sm90 {

// A 4-d TMA descriptor of a [batch, heads, rows, head_dim] tensor of 16-bit
// elements with the given element strides; boxes of 64 columns x box_rows.
inline cudaError_t make_map(CUtensorMap& map, const void* data, bool bf16, int head_dim, int rows, int heads, int batch,
                            std::int64_t row_stride, std::int64_t head_stride, std::int64_t batch_stride,
                            int box_rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(row_stride) * 2, cuuint64_t(head_stride) * 2, cuuint64_t(batch_stride) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult r =
      encode(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
             const_cast<void*>(data), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace sm90

template <class Cfg, MaskMode kMask, bool kBf16>
cudaError_t run_flash_fwd_sm90(const FwdArgs& a, cudaStream_t stream) {
  FlashSm90Maps maps;
  const int kv_heads = a.heads / a.group;
  for (cudaError_t e : {
           sm90::make_map(maps.q, a.q, kBf16, Cfg::kHeadDim, a.seq_q, a.heads, a.batch, a.q_row_stride, a.q_head_stride,
                          a.q_batch_stride, Cfg::kBlockM),
           sm90::make_map(maps.k, a.k, kBf16, Cfg::kHeadDim, a.seq_k, kv_heads, a.batch, a.k_row_stride,
                          a.k_head_stride, a.k_batch_stride, Cfg::kBlockN),
           sm90::make_map(maps.v, a.v, kBf16, Cfg::kHeadDim, a.seq_k, kv_heads, a.batch, a.v_row_stride,
                          a.v_head_stride, a.v_batch_stride, Cfg::kBlockN),
       }) {
    if (e != cudaSuccess) return e;
  }
  const auto kernel = flash_fwd_sm90_kernel<Cfg, kMask, kBf16>;
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid((a.seq_q + Cfg::kBlockM - 1) / Cfg::kBlockM, a.heads, a.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a, maps);
  return cudaGetLastError();
}

}  // namespace attnprof::cuda::kernels
