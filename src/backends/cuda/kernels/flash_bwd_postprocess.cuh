// The backwards' last kernel when dQ was summed into the FP32 accumulator
// (flash_bwd_sm80.cuh, flash_bwd_sm90.cuh): the accumulator, already scaled,
// to dQ in the element type, vectorised (the issue 21 profile read the
// scalar version at a fifth of the bandwidth). sm80's accumulator is
// row-major; sm90's 64-row tiles are in its register order (DqTileLayout,
// epilogue_bwd_sm90.cuh), read here 16 bytes a thread in that order and
// turned row-major through shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/epilogue_bwd_sm90.cuh"

namespace attnprof::cuda::kernels {

// The dQ accumulator ([B, H, rows_pad, D] f32) into dQ, rows < seq_q (each
// sequence's own, packed batches): x blocks of 256 (row, 16-byte chunk)
// slots of one (batch, head), y the (batch, head) pairs (bwd_rows_grid).
template <Half16 Element>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_kernel(const __grid_constant__ BwdArgs a) {
  const FwdArgs& f = a.f;
  const int chunks = a.head_dim / 8;
  const int e = static_cast<int>(blockIdx.x) * 256 + static_cast<int>(threadIdx.x);
  const int i = e / chunks, c = e % chunks;
  for (int bh = blockIdx.y; bh < f.batch * f.heads; bh += gridDim.y) {
    const int head = bh % f.heads, batch = bh / f.heads;
    const BwdArgs seq = a.sequence(batch);  // the row's sequence (packed batches)
    if (i >= seq.f.seq_q) continue;
    const auto* acc = reinterpret_cast<const float4*>(
        a.dq_accum + (static_cast<std::int64_t>(bh) * a.rows_pad + i) * a.head_dim + 8 * c);
    const float4 lo = acc[0], hi = acc[1];
    const uint4 out{pack2<Element>(lo.x, lo.y), pack2<Element>(lo.z, lo.w), pack2<Element>(hi.x, hi.y),
                    pack2<Element>(hi.z, hi.w)};
    *reinterpret_cast<uint4*>(seq.dq + batch * seq.dq_batch_stride + head * seq.dq_head_stride + i * seq.dq_row_stride +
                              8 * c) = out;
  }
}

template <Half16 Element>
cudaError_t launch_bwd_convert_dq(const BwdArgs& a, cudaStream_t stream) {
  const std::int64_t slots = static_cast<std::int64_t>(a.f.seq_q) * (a.head_dim / 8);
  flash_bwd_convert_dq_kernel<Element><<<bwd_rows_grid(a, (slots + 255) / 256), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

// sm90's tiled accumulator into dQ, a block a 16-row slab of a 64-row tile
// (warp w's rows of both consumers' column halves): the slab's fragments read
// in their staged order (16 bytes a thread, contiguous), laid out row-major
// in shared memory, then written 8 columns (16 bytes) a thread along dQ's
// rows. (Written straight from the fragments, each warp store covered eight
// 16-byte pieces of eight rows: 95 us where cuDNN's took 59 on issue 22's
// packed batch.) x: the slabs of one (batch, head)'s tiles; y: the (batch,
// head) pairs (bwd_rows_grid).
template <Half16 Element, int kPadDim>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_tiled_kernel(const __grid_constant__ BwdArgs a) {
  constexpr int kDqCols = kPadDim / 2, kDqTiles = kDqCols / 8;
  constexpr int kSlabSlots = 2 * kDqTiles * 32;  // float4s: two consumers' fragments of one warp
  constexpr int kStride = kPadDim + 8;           // floats a row (+8: a float2 store's rows on distinct banks)
  __shared__ float slab[16 * kStride];
  const FwdArgs& f = a.f;
  const int tile = static_cast<int>(blockIdx.x) / 4, warp = static_cast<int>(blockIdx.x) % 4;
  const int row0 = tile * 64 + warp * 16;  // the slab's first row in its (batch, head)
  for (int bh = blockIdx.y; bh < f.batch * f.heads; bh += gridDim.y) {
    const int head = bh % f.heads, batch = bh / f.heads;
    const BwdArgs seq = a.sequence(batch);  // the rows' sequence (packed batches)
    if (row0 >= seq.f.seq_q) continue;      // the whole block
    const float* tile_at = a.dq_accum + (static_cast<std::int64_t>(bh) * a.rows_pad + tile * 64) * kPadDim;
    for (int s = threadIdx.x; s < kSlabSlots; s += 256) {
      const int wg = s / (kDqTiles * 32), nt = s / 32 % kDqTiles, lane = s % 32;
      const float4 v = *reinterpret_cast<const float4*>(tile_at + DqTileLayout<kDqTiles>::offset(wg, warp, nt, lane));
      float* at = slab + (lane / 4) * kStride + consumer_column<kPadDim>(wg, nt) + 2 * (lane % 4);
      *reinterpret_cast<float2*>(at) = make_float2(v.x, v.y);
      *reinterpret_cast<float2*>(at + 8 * kStride) = make_float2(v.z, v.w);
    }
    __syncthreads();
    const int rows = min(16, seq.f.seq_q - row0), chunks = a.head_dim / 8;
    for (int e = threadIdx.x; e < rows * chunks; e += 256) {
      const int r = e / chunks, c = e % chunks;
      const float4 lo = *reinterpret_cast<const float4*>(slab + r * kStride + 8 * c);
      const float4 hi = *reinterpret_cast<const float4*>(slab + r * kStride + 8 * c + 4);
      *reinterpret_cast<uint4*>(seq.dq + batch * seq.dq_batch_stride + head * seq.dq_head_stride +
                                (row0 + r) * seq.dq_row_stride + 8 * c) =
          uint4{pack2<Element>(lo.x, lo.y), pack2<Element>(lo.z, lo.w), pack2<Element>(hi.x, hi.y),
                pack2<Element>(hi.z, hi.w)};
    }
    __syncthreads();  // the slab is read before the next (batch, head) writes it
  }
}

template <Half16 Element, int kPadDim>
cudaError_t launch_bwd_convert_dq_tiled(const BwdArgs& a, cudaStream_t stream) {
  flash_bwd_convert_dq_tiled_kernel<Element, kPadDim>
      <<<bwd_rows_grid(a, static_cast<std::int64_t>(a.rows_pad / 64) * 4), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace attnprof::cuda::kernels
