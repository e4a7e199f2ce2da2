// The backwards' first kernel (flash_bwd_sm80.cuh, flash_bwd_sm90.cuh): per
// query row D = rowsum(dO * O), the term of dS = P (dP - D); the LSE in log2
// units where the sm90 kernel reads it (BwdArgs::lse_log2); the FP32 dQ
// accumulator and the ordered-dQ semaphores zeroed (no cudaMemset). It covers
// the padded rows of a sequence's last query tile too (D = 0, LSE +inf), so a
// query tile read whole adds nothing from rows past seq_q; rows past that tile
// (a packed batch's shorter sequences) are left alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/utils.cuh"

namespace attnprof::cuda::kernels {

// Eight elements of a 16-byte chunk as f32, multiplied pairwise and summed.
template <Half16 Element>
__device__ __forceinline__ float dot8(const uint4& x, const uint4& y) {
  const std::uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum += to_float<Element>(static_cast<std::uint16_t>(xs[i] & 0xFFFF)) *
           to_float<Element>(static_cast<std::uint16_t>(ys[i] & 0xFFFF));
    sum += to_float<Element>(static_cast<std::uint16_t>(xs[i] >> 16)) *
           to_float<Element>(static_cast<std::uint16_t>(ys[i] >> 16));
  }
  return sum;
}

// kLanes lanes a row (head_dim / 8 rounded up to a power of two, at most a
// warp: 8 at head dim 64, 32 at 256), each with its 16-byte chunks of O and
// dO (head_dim is a multiple of 8 and rows are 16-byte aligned:
// fused_bwd_unsupported_reason) and its share of the row's accumulator. (One
// warp a row left three lanes in four idle at head dim 64: 46 us where cuDNN's
// pass took 19 on 8 x 16 x 1024 x 64, docs/perf/issue21-2026-12-02b.md.)
template <Half16 Element, int kLanes>
__global__ void __launch_bounds__(256) flash_bwd_preprocess_kernel(const __grid_constant__ BwdArgs a) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power-of-two share of a warp");
  constexpr int kRows = 256 / kLanes;  // rows a block
  allow_dependents();                  // the sm90 backward's kernel may start its setup (it waits for these rows)
  const FwdArgs& f = a.f;
  const int row0 = static_cast<int>(blockIdx.x) * kRows;
  const int i = row0 + static_cast<int>(threadIdx.x) / kLanes;  // the row within its (batch, head)
  const int lane = threadIdx.x % kLanes;
  for (int bh = blockIdx.y; bh < f.batch * f.heads; bh += gridDim.y) {
    const int head = bh % f.heads, batch = bh / f.heads;
    const BwdArgs seq = a.sequence(batch);  // the row's sequence (packed batches, key counts)
    const FwdArgs& sf = seq.f;
    const int rows = bwd_rows_read(sf.seq_q, a.rows_pad);
    if (row0 >= rows) continue;  // the whole block: past the tiles the backward reads
    float sum = 0.f;
    if (i < sf.seq_q) {
      const auto* o = reinterpret_cast<const uint4*>(sf.o + batch * sf.o_batch_stride + head * sf.o_head_stride +
                                                     i * sf.o_row_stride);
      const auto* d_o = reinterpret_cast<const uint4*>(seq.dout + batch * seq.do_batch_stride +
                                                       head * seq.do_head_stride + i * seq.do_row_stride);
      for (int c = lane; c < a.head_dim / 8; c += kLanes) sum += dot8<Element>(o[c], d_o[c]);
    }
#pragma unroll
    for (int w = kLanes / 2; w > 0; w /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, w);
    if (i >= rows) continue;
    const std::int64_t r = static_cast<std::int64_t>(bh) * a.rows_pad + i;
    if (lane == 0) {
      a.dsum[r] = sum;
      if (a.lse_log2 != nullptr) {
        a.lse_log2[r] =
            i < sf.seq_q ? lse_log2(sf.lse[batch * sf.lse_batch_stride + head * sf.lse_head_stride + i]) : INFINITY;
      }
      if (a.dq_semaphore != nullptr && i % 64 == 0) a.dq_semaphore[r / 64] = 0;
    }
    if (a.dq_accum != nullptr) {
      // The row's share of the accumulator (in the sm90 kernel's tile order a
      // row is not contiguous, but the rows of whole tiles cover their tiles).
      auto* acc = reinterpret_cast<float4*>(a.dq_accum + r * a.dq_accum_cols);
      for (int c = lane; c < a.dq_accum_cols / 4; c += kLanes) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

template <Half16 Element, int kLanes>
cudaError_t launch_bwd_preprocess_lanes(const BwdArgs& a, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 256 / kLanes;
  flash_bwd_preprocess_kernel<Element, kLanes>
      <<<bwd_rows_grid(a, (a.rows_pad + kRowsPerBlock - 1) / kRowsPerBlock), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

template <Half16 Element>
cudaError_t launch_bwd_preprocess(const BwdArgs& a, cudaStream_t stream) {
  const int chunks = a.head_dim / 8;
  if (chunks <= 8) return launch_bwd_preprocess_lanes<Element, 8>(a, stream);
  if (chunks <= 16) return launch_bwd_preprocess_lanes<Element, 16>(a, stream);
  return launch_bwd_preprocess_lanes<Element, 32>(a, stream);
}

}  // namespace attnprof::cuda::kernels
