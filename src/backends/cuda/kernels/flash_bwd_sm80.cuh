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
// shared tiles through ldmatrix (warp_gemm below), so one routine serves the
// five products whatever their operands' layouts; P and dS go through shared
// memory as 16-bit tiles. A fully masked row has LSE +inf (the forward's
// convention; -inf or NaN are taken the same way): its P is 0, so it adds
// nothing to dK and dV and gets dQ = 0; keys no query sees get dK = dV = 0.
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

#include "backends/cuda/fused_params.h"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/mma_sm80.cuh"
#include "backends/cuda/kernels/tile_load_sm80.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/warp_gemm_sm80.cuh"

namespace attnprof::cuda::kernels {

struct BwdArgs {
  FwdArgs f;  // q, k, v, o (O of the forward), their strides, sizes, mask, lse (read)
  const std::uint16_t* dout;
  std::int64_t do_batch_stride, do_head_stride, do_row_stride;
  std::uint16_t* dq;
  std::uint16_t* dk;
  std::uint16_t* dv;
  std::int64_t dq_batch_stride, dq_head_stride, dq_row_stride;
  std::int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  std::int64_t dv_batch_stride, dv_head_stride, dv_row_stride;
  float* dsum;      // [B, H, Sq]
  float* dq_accum;  // [B, H, Sq, D], or null when deterministic
  float scale;      // softmax scale (dQ = scale dS K, dK = scale dS^T Q)
  int head_dim;

  static BwdArgs from(const FusedBwdParams& p) {
    return BwdArgs{
        .f = FwdArgs::from(p.fwd),
        .dout = static_cast<const std::uint16_t*>(p.dout),
        .do_batch_stride = p.do_batch_stride,
        .do_head_stride = p.do_head_stride,
        .do_row_stride = p.do_row_stride,
        .dq = static_cast<std::uint16_t*>(p.dq),
        .dk = static_cast<std::uint16_t*>(p.dk),
        .dv = static_cast<std::uint16_t*>(p.dv),
        .dq_batch_stride = p.dq_batch_stride,
        .dq_head_stride = p.dq_head_stride,
        .dq_row_stride = p.dq_row_stride,
        .dk_batch_stride = p.dk_batch_stride,
        .dk_head_stride = p.dk_head_stride,
        .dk_row_stride = p.dk_row_stride,
        .dv_batch_stride = p.dv_batch_stride,
        .dv_head_stride = p.dv_head_stride,
        .dv_row_stride = p.dv_row_stride,
        .dsum = p.dsum,
        .dq_accum = p.deterministic ? nullptr : p.dq_accum,
        .scale = p.fwd.scale,
        .head_dim = p.fwd.head_dim,
    };
  }
};

// C[16 kMTiles, 8 kNTiles] += A[16 kMTiles, 16 kKSteps] B[16 kKSteps, 8 kNTiles]
// for one warp, operands in padded shared tiles:
//   kATrans false: A stored row-major [m][k] (a_tile.offset(m, k)); its rows
//                  [m0, m0 + 16 kMTiles) are this warp's;
//   kATrans true:  A stored transposed [k][m] (A = X^T of a row-major X);
//   kBKN false:    B stored [n][k] (B = Y^T of a row-major Y, as K in Q K^T);
//   kBKN true:     B stored [k][n] (as V in P V).
// The ldmatrix lane addresses follow the fragment layouts of mma_sm80.cuh.
template <Half16 Element, class ATile, class BTile, bool kATrans, bool kBKN, int kMTiles, int kNTiles, int kKSteps>
__device__ __forceinline__ void warp_gemm(float (&c)[kMTiles][kNTiles][4], const std::uint16_t* a_smem, int m0,
                                          const std::uint16_t* b_smem, int lane) {
  static_assert(kNTiles % 2 == 0, "B is loaded 16 columns at a time");
  // A: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
  const int a_lane = kATrans ? ATile::offset((lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8)
                             : ATile::offset((lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8);
  // B: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
  const int b_lane = kBKN ? BTile::offset((lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8)
                          : BTile::offset((lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8);
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

// Query rows [begin, end) whose visible keys meet keys [n0, n0 + kBlockN).
struct QueryRange {
  int begin, end;
};

template <MaskMode kMask, int kBlockN>
__device__ __forceinline__ QueryRange query_range(const FwdArgs& a, int n0) {
  int lo = 0, hi = a.seq_q;
  // Row i sees key j when j <= i + off (Causal, Window) and j > i + off - window (Window).
  if constexpr (kMask != MaskMode::None) lo = max(lo, n0 - a.diag_offset);
  if constexpr (kMask == MaskMode::Window) hi = min(hi, n0 + kBlockN - 1 - a.diag_offset + a.window);
  return {lo, hi};
}

__device__ __forceinline__ float lse_log2(float lse) {
  // A fully masked row: +inf (or -inf, NaN) means P = 2^(s - inf) = 0 throughout.
  return isfinite(lse) ? lse * 1.4426950408889634f : INFINITY;
}

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
    const std::int64_t idx = (static_cast<std::int64_t>(batch) * f.heads + head) * f.seq_q + row;
    reinterpret_cast<float*>(smem + Cfg::kLseOff)[tid] = row < f.seq_q ? lse_log2(f.lse[idx]) : INFINITY;
    reinterpret_cast<float*>(smem + Cfg::kDOff)[tid] = row < f.seq_q ? a.dsum[idx] : 0.f;
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
  warp_gemm<Element, QTile, KTile, false, false, 1, kNT, Cfg::kDSteps>(
      s, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kQOff), row0,
      reinterpret_cast<const std::uint16_t*>(smem + Cfg::kKOff), lane);
  warp_gemm<Element, QTile, KTile, false, false, 1, kNT, Cfg::kDSteps>(
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

// D = rowsum(dO * O) per query row, one warp a row; zeroes the row's dQ
// accumulator when there is one.
template <Half16 Element>
__global__ void __launch_bounds__(128) flash_bwd_preprocess_kernel(const __grid_constant__ BwdArgs a) {
  const FwdArgs& f = a.f;
  const std::int64_t rows = static_cast<std::int64_t>(f.batch) * f.heads * f.seq_q;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int i = static_cast<int>(r % f.seq_q);
  const int head = static_cast<int>((r / f.seq_q) % f.heads);
  const int batch = static_cast<int>(r / (static_cast<std::int64_t>(f.seq_q) * f.heads));
  const std::uint16_t* o = f.o + batch * f.o_batch_stride + head * f.o_head_stride + i * f.o_row_stride;
  const std::uint16_t* d_o = a.dout + batch * a.do_batch_stride + head * a.do_head_stride + i * a.do_row_stride;
  float sum = 0.f;
  for (int d = lane; d < a.head_dim; d += 32) sum += to_float<Element>(o[d]) * to_float<Element>(d_o[d]);
#pragma unroll
  for (int w = 16; w > 0; w /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, w);
  if (lane == 0) a.dsum[r] = sum;
  if (a.dq_accum != nullptr) {
    for (int d = lane; d < a.head_dim; d += 32) a.dq_accum[r * a.head_dim + d] = 0.f;
  }
}

// The dQ accumulator ([B, H, Sq, D] f32, already scaled) into dQ.
template <Half16 Element>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_kernel(const __grid_constant__ BwdArgs a) {
  const FwdArgs& f = a.f;
  const std::int64_t n = static_cast<std::int64_t>(f.batch) * f.heads * f.seq_q * a.head_dim;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(e % a.head_dim);
    const std::int64_t r = e / a.head_dim;
    const int i = static_cast<int>(r % f.seq_q);
    const int head = static_cast<int>((r / f.seq_q) % f.heads);
    const int batch = static_cast<int>(r / (static_cast<std::int64_t>(f.seq_q) * f.heads));
    a.dq[batch * a.dq_batch_stride + head * a.dq_head_stride + i * a.dq_row_stride + d] =
        from_float<Element>(a.dq_accum[e]);
  }
}

// dK and dV of one key tile (and dQ by atomics unless kDeterministic).
template <class Cfg, MaskMode kMask, Half16 Element, bool kDeterministic>
__global__ void __launch_bounds__(Cfg::kThreads) flash_bwd_dkdv_kernel(const __grid_constant__ BwdArgs a) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim, kT = Cfg::kThreads;
  constexpr int kNT = kBN / 8, kDT = Cfg::kDTiles;
  using QTile = typename Cfg::QTile;
  using KTile = typename Cfg::KTile;
  using PTile = typename Cfg::PTile;
  extern __shared__ __align__(128) unsigned char smem[];
  const FwdArgs& f = a.f;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = blockIdx.x * kBN, kv_head = blockIdx.y, batch = blockIdx.z;
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
  const QueryRange rows = query_range<kMask, kBN>(f, n0);
  const int m_begin = rows.begin < rows.end ? rows.begin / kBM : 0;
  const int m_end = rows.begin < rows.end ? (rows.end + kBM - 1) / kBM : 0;

  for (int g = 0; g < f.group; ++g) {
    const int head = kv_head * f.group + g;
    for (int m_block = m_begin; m_block < m_end; ++m_block) {
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
      warp_gemm<Element, PTile, QTile, true, true, 1, kDT, kBM / 16>(
          dv, p_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kDoOff), lane);
      warp_gemm<Element, PTile, QTile, true, true, 1, kDT, kBM / 16>(
          dk, ds_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kQOff), lane);
      if constexpr (!kDeterministic) {
        // This warp's 16 query rows: dQ += scale dS K, added into the FP32 accumulator.
        float dq[1][kDT][4];
        zero(dq);
        warp_gemm<Element, PTile, KTile, false, true, 1, kDT, kBN / 16>(
            dq, ds_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kKOff), lane);
        const int gq = lane / 4, t = lane % 4;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + warp * 16 + gq + 8 * h;
          if (row >= f.seq_q) continue;
          float* const acc =
              a.dq_accum + ((static_cast<std::int64_t>(batch) * f.heads + head) * f.seq_q + row) * kD + 2 * t;
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) {
            atomicAdd(acc + dt * 8, dq[0][dt][2 * h] * a.scale);
            atomicAdd(acc + dt * 8 + 1, dq[0][dt][2 * h + 1] * a.scale);
          }
        }
      }
      __syncthreads();  // Q, dO, P, dS are refilled by the next tile
    }
  }
  cp_async_wait<0>();  // K and V, when no query tile was visited

  store_rows<Element>(a.dk + batch * a.dk_batch_stride + kv_head * a.dk_head_stride + n0 * a.dk_row_stride,
                      a.dk_row_stride, dk, a.scale, warp * 16, f.seq_k - n0, lane);
  store_rows<Element>(a.dv + batch * a.dv_batch_stride + kv_head * a.dv_head_stride + n0 * a.dv_row_stride,
                      a.dv_row_stride, dv, 1.f, warp * 16, f.seq_k - n0, lane);
}

// Deterministic dQ of one query tile: its visible key tiles in one fixed
// order (first to last), recomputing P and dS; dQ written once, no atomics.
template <class Cfg, MaskMode kMask, Half16 Element>
__global__ void __launch_bounds__(Cfg::kThreads) flash_bwd_dq_kernel(const __grid_constant__ BwdArgs a) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kHeadDim, kT = Cfg::kThreads;
  constexpr int kNT = kBN / 8, kDT = Cfg::kDTiles;
  using KTile = typename Cfg::KTile;
  using PTile = typename Cfg::PTile;
  extern __shared__ __align__(128) unsigned char smem[];
  const FwdArgs& f = a.f;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = blockIdx.x * kBM, head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / f.group;
  std::uint16_t* const ds_s = reinterpret_cast<std::uint16_t*>(smem + Cfg::kDsOff);

  load_query_tile<Cfg>(a, smem, batch, head, m0, tid);
  float dq[1][kDT][4];
  zero(dq);
  const KeyTiles tiles = key_tiles<kMask, kBM, kBN>(f, m0);
  const std::uint16_t* k = f.k + batch * f.k_batch_stride + kv_head * f.k_head_stride;
  const std::uint16_t* v = f.v + batch * f.v_batch_stride + kv_head * f.v_head_stride;
  for (int n_block = tiles.begin; n_block < tiles.end; ++n_block) {
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
    warp_gemm<Element, PTile, KTile, false, true, 1, kDT, kBN / 16>(
        dq, ds_s, warp * 16, reinterpret_cast<const std::uint16_t*>(smem + Cfg::kKOff), lane);
    __syncthreads();  // K, V and dS are refilled by the next tile
  }
  cp_async_wait<0>();  // Q and dO, when no key tile was visited
  store_rows<Element>(a.dq + batch * a.dq_batch_stride + head * a.dq_head_stride + m0 * a.dq_row_stride,
                      a.dq_row_stride, dq, a.scale, warp * 16, f.seq_q - m0, lane);
}

template <class Kernel>
cudaError_t opt_in_smem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// The three kernels of one backward on `stream`.
template <int kHeadDim, MaskMode kMask, Half16 Element>
cudaError_t launch_flash_bwd_sm80(const BwdArgs& a, cudaStream_t stream) {
  using Cfg = BwdCfg<kHeadDim>;
  const FwdArgs& f = a.f;
  const bool deterministic = a.dq_accum == nullptr;
  const std::int64_t rows = static_cast<std::int64_t>(f.batch) * f.heads * f.seq_q;
  flash_bwd_preprocess_kernel<Element><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(a);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  const dim3 kv_grid((f.seq_k + Cfg::kBlockN - 1) / Cfg::kBlockN, f.heads / f.group, f.batch);
  if (deterministic) {
    auto* dkdv = flash_bwd_dkdv_kernel<Cfg, kMask, Element, true>;
    if (const cudaError_t err = opt_in_smem(dkdv, Cfg::kSmemBytes); err != cudaSuccess) return err;
    dkdv<<<kv_grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    auto* dq = flash_bwd_dq_kernel<Cfg, kMask, Element>;
    if (const cudaError_t err = opt_in_smem(dq, Cfg::kSmemBytes); err != cudaSuccess) return err;
    const dim3 q_grid((f.seq_q + Cfg::kBlockM - 1) / Cfg::kBlockM, f.heads, f.batch);
    dq<<<q_grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
    return cudaGetLastError();
  }
  auto* dkdv = flash_bwd_dkdv_kernel<Cfg, kMask, Element, false>;
  if (const cudaError_t err = opt_in_smem(dkdv, Cfg::kSmemBytes); err != cudaSuccess) return err;
  dkdv<<<kv_grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  const std::int64_t n = rows * kHeadDim;
  const std::int64_t blocks = (n + 255) / 256;
  flash_bwd_convert_dq_kernel<Element>
      <<<static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

// Explicit instantiations of launch_flash_bwd_sm80 at one head dim, every mask
// and element type (src/backends/cuda/fused_bwd_hdim*.cu); with `extern`
// before `template`, the declarations that the dispatching file sees instead.
#define ATTNPROF_BWD_INSTANTIATE_ONE(prefix, head_dim, mask, element) \
  prefix template cudaError_t launch_flash_bwd_sm80<head_dim, mask, element>(const BwdArgs&, cudaStream_t);
#define ATTNPROF_BWD_INSTANTIATE_AS(prefix, head_dim)                    \
  ATTNPROF_BWD_INSTANTIATE_ONE(prefix, head_dim, MaskMode::None, Bf16)   \
  ATTNPROF_BWD_INSTANTIATE_ONE(prefix, head_dim, MaskMode::Causal, Bf16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(prefix, head_dim, MaskMode::Window, Bf16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(prefix, head_dim, MaskMode::None, Fp16)   \
  ATTNPROF_BWD_INSTANTIATE_ONE(prefix, head_dim, MaskMode::Causal, Fp16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(prefix, head_dim, MaskMode::Window, Fp16)
#define ATTNPROF_BWD_INSTANTIATE(head_dim) ATTNPROF_BWD_INSTANTIATE_AS(, head_dim)
#define ATTNPROF_BWD_EXTERN(head_dim) ATTNPROF_BWD_INSTANTIATE_AS(extern, head_dim)

}  // namespace attnprof::cuda::kernels
