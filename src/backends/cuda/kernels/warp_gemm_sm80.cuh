// How the sm80 fused kernels split a tile among warps (WarpTiling), and the
// two matrix products of attention for one warp's 16*kMTiles query rows, on
// mma.m16n8k16 with operands from ldmatrix:
//   S = Q K^T   (Q from registers or shared memory, K from shared memory)
//   O += P V    (P from the S accumulators, converted to 16 bits in registers;
//                V from shared memory through ldmatrix.trans)
// and, for the backward (flash_bwd_sm80.cuh), warp_gemm_ss: any product with
// both operands in shared memory, either of them stored transposed.
// Shared tiles use the padded layout of SmemTile.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/mma_sm80.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"

namespace attnprof::cuda::kernels {

// How both fused kernels split a kBlockM x kBlockN score tile: 4 warps, each
// owning 16*kMTiles whole query rows; n-tiles of 8 keys, k-steps of 16 head
// dims, d-tiles of 8 output columns. A kernel's Cfg adds its shared-memory plan.
template <int kHeadDim_, int kBlockM_, int kBlockN_>
struct WarpTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  static_assert(kRowsPerWarp % 16 == 0, "a warp owns whole 16-row m-tiles");
  static_assert(kNTiles % 2 == 0, "keys are loaded 16 at a time");
  static_assert(kDTiles % 2 == 0, "head_dim is loaded 16 columns at a time");
};

// c0 += a b0, c1 += a b1: one A fragment against the two n8 halves of a
// 16-wide B fragment that ldmatrix_x4 loaded.
template <Half16 Element>
__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const std::uint32_t (&a)[4],
                                         const std::uint32_t (&b)[4]) {
  mma_16816<Element>(c0, a, b[0], b[1]);
  mma_16816<Element>(c1, a, b[2], b[3]);
}

// Element offset inside a 16x16 block that lane gives ldmatrix_x4 for an A
// operand (or for V read transposed): matrices ordered (rows 0-7, cols 0-7),
// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15).
template <class Tile>
__device__ __forceinline__ int lane_offset_a(int lane) {
  return Tile::offset((lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8);
}

// The same for K as a B operand (two n8 tiles, each k 0-7 then k 8-15):
// matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
template <class Tile>
__device__ __forceinline__ int lane_offset_k(int lane) {
  return Tile::offset((lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8);
}

// Loads a warp's Q rows [row0, row0 + 16*kMTiles) as A fragments.
template <class QTile, int kMTiles, int kKSteps>
__device__ __forceinline__ void load_q_fragments(std::uint32_t (&q)[kMTiles][kKSteps][4], const std::uint16_t* q_smem,
                                                 int row0, int lane) {
  const std::uint32_t base = smem_u32(q_smem + QTile::offset(row0, 0) + lane_offset_a<QTile>(lane));
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) ldmatrix_x4(q[mt][kk], base + 2 * QTile::offset(mt * 16, kk * 16));
  }
}

// S = Q K^T against the key tile in k_smem. load_a(kk, a) puts the Q
// fragments of k-step kk into a[kMTiles][4]; each is used against every key.
template <Half16 Element, class KTile, int kMTiles, int kNTiles, int kKSteps, class LoadA>
__device__ __forceinline__ void gemm_qk_steps(float (&s)[kMTiles][kNTiles][4], const std::uint16_t* k_smem, int lane,
                                              LoadA&& load_a) {
  static_assert(kNTiles % 2 == 0, "keys are loaded 16 at a time");
  zero(s);
  const std::uint32_t k_base = smem_u32(k_smem + lane_offset_k<KTile>(lane));
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    std::uint32_t a[kMTiles][4];
    load_a(kk, a);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      std::uint32_t b[4];
      ldmatrix_x4(b, k_base + 2 * KTile::offset(np * 16, kk * 16));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) mma_pair<Element>(s[mt][2 * np], s[mt][2 * np + 1], a[mt], b);
    }
  }
}

// S = Q K^T with Q fragments in registers (load_q_fragments). Q stays in
// registers only because everything here is inlined and unrolled (kk is a
// constant at each call); build logs are checked for spills (scripts/gpu.sh).
template <Half16 Element, class KTile, int kMTiles, int kNTiles, int kKSteps>
__device__ __forceinline__ void gemm_qk(float (&s)[kMTiles][kNTiles][4], const std::uint32_t (&q)[kMTiles][kKSteps][4],
                                        const std::uint16_t* k_smem, int lane) {
  gemm_qk_steps<Element, KTile, kMTiles, kNTiles, kKSteps>(s, k_smem, lane, [&](int kk, std::uint32_t(&a)[kMTiles][4]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) a[mt][e] = q[mt][kk][e];
  });
}

// S = Q K^T with Q read from shared memory one k-step at a time (keeps only
// 4*kMTiles registers of Q live; costs one ldmatrix per m-tile and k-step).
template <Half16 Element, class QTile, class KTile, int kMTiles, int kNTiles, int kKSteps>
__device__ __forceinline__ void gemm_qk_smem(float (&s)[kMTiles][kNTiles][4], const std::uint16_t* q_smem, int row0,
                                             const std::uint16_t* k_smem, int lane) {
  const std::uint32_t q_base = smem_u32(q_smem + QTile::offset(row0, 0) + lane_offset_a<QTile>(lane));
  gemm_qk_steps<Element, KTile, kMTiles, kNTiles, kKSteps>(s, k_smem, lane, [&](int kk, std::uint32_t(&a)[kMTiles][4]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4(a[mt], q_base + 2 * QTile::offset(mt * 16, kk * 16));
  });
}

// O += P V, P packed from the S accumulators one key step at a time (pack_p).
template <Half16 Element, class VTile, int kMTiles, int kNTiles, int kDTiles>
__device__ __forceinline__ void gemm_pv(float (&o)[kMTiles][kDTiles][4], const float (&p)[kMTiles][kNTiles][4],
                                        const std::uint16_t* v_smem, int lane) {
  static_assert(kDTiles % 2 == 0, "head_dim is loaded 16 columns at a time");
  const std::uint32_t base = smem_u32(v_smem + lane_offset_a<VTile>(lane));
#pragma unroll
  for (int kk = 0; kk < kNTiles / 2; ++kk) {
    std::uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) pack_p<Element>(a[mt], p[mt], kk);
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, base + 2 * VTile::offset(kk * 16, dp * 16));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) mma_pair<Element>(o[mt][2 * dp], o[mt][2 * dp + 1], a[mt], b);
    }
  }
}

// The general product with both operands in padded shared tiles (the
// backward's five): C[16 kMTiles, 8 kNTiles] += A[16 kMTiles, 16 kKSteps]
// B[16 kKSteps, 8 kNTiles] for one warp:
//   kATrans false: A stored row-major [m][k] (a_tile.offset(m, k)); its rows
//                  [m0, m0 + 16 kMTiles) are this warp's;
//   kATrans true:  A stored transposed [k][m] (A = X^T of a row-major X);
//   kBKN false:    B stored [n][k] (B = Y^T of a row-major Y, as K in Q K^T);
//   kBKN true:     B stored [k][n] (as V in P V).
// The ldmatrix lane addresses follow the fragment layouts of mma_sm80.cuh.
template <Half16 Element, class ATile, class BTile, bool kATrans, bool kBKN, int kMTiles, int kNTiles, int kKSteps>
__device__ __forceinline__ void warp_gemm_ss(float (&c)[kMTiles][kNTiles][4], const std::uint16_t* a_smem, int m0,
                                             const std::uint16_t* b_smem, int lane) {
  static_assert(kNTiles % 2 == 0, "B is loaded 16 columns at a time");
  // A as an A operand (or, stored transposed, read as K is); B as K is (or,
  // stored [k][n], as V is): the lane offsets above.
  const int a_lane = kATrans ? lane_offset_k<ATile>(lane) : lane_offset_a<ATile>(lane);
  const int b_lane = kBKN ? lane_offset_a<BTile>(lane) : lane_offset_k<BTile>(lane);
  const std::uint32_t a_base = smem_u32(a_smem + a_lane);
  const std::uint32_t b_base = smem_u32(b_smem + b_lane);
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    std::uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kATrans) {
        ldmatrix_x4_trans(a[mt], a_base + 2 * ATile::offset(kk * 16, m0 + mt * 16));
      } else {
        ldmatrix_x4(a[mt], a_base + 2 * ATile::offset(m0 + mt * 16, kk * 16));
      }
    }
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      std::uint32_t b[4];
      if constexpr (kBKN) {
        ldmatrix_x4_trans(b, b_base + 2 * BTile::offset(kk * 16, np * 16));
      } else {
        ldmatrix_x4(b, b_base + 2 * BTile::offset(np * 16, kk * 16));
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) mma_pair<Element>(c[mt][2 * np], c[mt][2 * np + 1], a[mt], b);
    }
  }
}

}  // namespace attnprof::cuda::kernels
