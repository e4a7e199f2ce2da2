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
#include "backends/cuda/kernels/fwd_launch.cuh"

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
    const BwdArgs seq = a.sequence(batch);  // the row's sequence (packed batches, a dense batch's rows)
    // Slot i is also row i of the tensor: a dense batch's rows outside the sequence's are zeros.
    if (f.q_spans != nullptr && i < f.seq_q && seq.f.q_row_outside(i)) {
      *reinterpret_cast<uint4*>(a.dq + batch * a.dq_batch_stride + head * a.dq_head_stride + i * a.dq_row_stride +
                                8 * c) = make_uint4(0u, 0u, 0u, 0u);
    }
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

// sm90's tiled accumulator into dQ, a block kSlabs 16-row slabs of a 64-row
// tile (slab w: warp w's rows of both consumers' column halves): the slabs'
// fragments read in their staged order (16 bytes a thread, contiguous, all
// of a thread's loads issued before any is used), laid out row-major in
// shared memory, then written 8 columns (16 bytes) a thread along dQ's rows.
// (Written straight from the fragments, each warp store covered eight
// 16-byte pieces of eight rows: 95 us where cuDNN's took 59 on issue 22's
// packed batch. A block of one slab, 4 KiB read at head dim 64, kept too
// few bytes in flight: 2.85 TB/s, 17.7 us on 8 x 16 x 1024 x 64, where the
// whole tile a block reads at 4.2 TB/s on the long rows;
// docs/perf/issue21-2026-12-04b.md.) x: the blocks of one (batch, head)'s
// tiles; y: the (batch, head) pairs (bwd_rows_grid).
template <int kPadDim>
inline constexpr int kConvertSlabs = kPadDim <= 128 ? 4 : 2;  // shared memory under 48 KiB

template <Half16 Element, int kPadDim>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_tiled_kernel(const __grid_constant__ BwdArgs a) {
  constexpr int kDqCols = kPadDim / 2, kDqTiles = kDqCols / 8;
  constexpr int kSlabs = kConvertSlabs<kPadDim>;
  constexpr int kSlabSlots = 2 * kDqTiles * 32;      // float4s: two consumers' fragments of one warp
  constexpr int kLoads = kSlabs * kSlabSlots / 256;  // a thread's
  constexpr int kStride = kPadDim + 8;               // floats a row (+8: a float2 store's rows on distinct banks)
  static_assert(kSlabs * kSlabSlots % 256 == 0, "whole loads a thread");
  __shared__ float rows_of[kSlabs * 16 * kStride];
  wait_prior_grid();  // launched after the backward's kernel (launch_after_prior): its adds have all landed
  const FwdArgs& f = a.f;
  constexpr int kBlocksPerTile = 4 / kSlabs;
  const int tile = static_cast<int>(blockIdx.x) / kBlocksPerTile;
  const int warp0 = static_cast<int>(blockIdx.x) % kBlocksPerTile * kSlabs;
  const int row0 = tile * 64 + warp0 * 16;  // the block's first row in its (batch, head)
  for (int bh = blockIdx.y; bh < f.batch * f.heads; bh += gridDim.y) {
    const int head = bh % f.heads, batch = bh / f.heads;
    const BwdArgs seq = a.sequence(batch);  // the rows' sequence (packed batches, a dense batch's rows)
    // The block's rows are also rows of the tensor: a dense batch's outside the sequence's are zeros.
    a.zero_dq_rows_outside(seq, batch, head, row0, 16 * kSlabs, threadIdx.x, 256);
    if (row0 >= seq.f.seq_q) continue;  // the whole block
    const float* tile_at = a.dq_accum + (static_cast<std::int64_t>(bh) * a.rows_pad + tile * 64) * kPadDim;
    float4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int s = static_cast<int>(threadIdx.x) + 256 * i, slab = s / kSlabSlots, r = s % kSlabSlots;
      const int wg = r / (kDqTiles * 32), nt = r / 32 % kDqTiles, lane = r % 32;
      v[i] = *reinterpret_cast<const float4*>(tile_at + DqTileLayout<kDqTiles>::offset(wg, warp0 + slab, nt, lane));
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int s = static_cast<int>(threadIdx.x) + 256 * i, slab = s / kSlabSlots, r = s % kSlabSlots;
      const int wg = r / (kDqTiles * 32), nt = r / 32 % kDqTiles, lane = r % 32;
      float* at = rows_of + (slab * 16 + lane / 4) * kStride + consumer_column<kPadDim>(wg, nt) + 2 * (lane % 4);
      *reinterpret_cast<float2*>(at) = make_float2(v[i].x, v[i].y);
      *reinterpret_cast<float2*>(at + 8 * kStride) = make_float2(v[i].z, v[i].w);
    }
    __syncthreads();
    const int rows = min(16 * kSlabs, seq.f.seq_q - row0), chunks = a.head_dim / 8;
    for (int e = threadIdx.x; e < rows * chunks; e += 256) {
      const int r = e / chunks, c = e % chunks;
      const float4 lo = *reinterpret_cast<const float4*>(rows_of + r * kStride + 8 * c);
      const float4 hi = *reinterpret_cast<const float4*>(rows_of + r * kStride + 8 * c + 4);
      *reinterpret_cast<uint4*>(seq.dq + batch * seq.dq_batch_stride + head * seq.dq_head_stride +
                                (row0 + r) * seq.dq_row_stride + 8 * c) =
          uint4{pack2<Element>(lo.x, lo.y), pack2<Element>(lo.z, lo.w), pack2<Element>(hi.x, hi.y),
                pack2<Element>(hi.z, hi.w)};
    }
    __syncthreads();  // the rows are read before the next (batch, head) writes them
  }
}

template <Half16 Element, int kPadDim>
cudaError_t launch_bwd_convert_dq_tiled(const BwdArgs& a, cudaStream_t stream) {
  constexpr int kBlocksPerTile = 4 / kConvertSlabs<kPadDim>;
  return launch_after_prior(flash_bwd_convert_dq_tiled_kernel<Element, kPadDim>,
                            bwd_rows_grid(a, static_cast<std::int64_t>(a.rows_pad / 64) * kBlocksPerTile), 256, 0,
                            stream, a);
}

// The group's partial dK and dV (BwdArgs::group_split > 1; the kernel's
// store_dkdv) summed in part order (the same bits every run) into dK (times
// scale) and dV in the element type, 4 columns a thread: y 0 dK, 1 dV.
template <Half16 Element, int kPadDim>
__global__ void __launch_bounds__(256) flash_bwd_sum_dkv_kernel(const __grid_constant__ BwdArgs a) {
  wait_prior_grid();  // the partials are the backward kernel's, which the dQ conversion waited for
  const FwdArgs& f = a.f;
  const int kv_heads = f.heads / f.group, chunks = a.head_dim / 4;
  const std::int64_t slice = static_cast<std::int64_t>(f.batch) * kv_heads * f.k_rows * kPadDim;
  const bool is_v = blockIdx.y == 1;
  const float* const parts = a.dkv_partial + (is_v ? a.group_split * slice : 0);
  const float scale = is_v ? 1.f : a.scale;
  std::uint16_t* const out = is_v ? a.dv : a.dk;
  const std::int64_t batch_stride = is_v ? a.dv_batch_stride : a.dk_batch_stride;
  const std::int64_t head_stride = is_v ? a.dv_head_stride : a.dk_head_stride;
  const std::int64_t row_stride = is_v ? a.dv_row_stride : a.dk_row_stride;
  const std::int64_t total = static_cast<std::int64_t>(f.batch) * kv_heads * f.k_rows * chunks;
  for (std::int64_t e = blockIdx.x * 256LL + threadIdx.x; e < total; e += static_cast<std::int64_t>(gridDim.x) * 256) {
    const int c = static_cast<int>(e % chunks);
    const std::int64_t r = e / chunks;  // (batch, kv head, row)
    const int row = static_cast<int>(r % f.k_rows);
    const std::int64_t bh = r / f.k_rows;
    const int kv_head = static_cast<int>(bh % kv_heads), batch = static_cast<int>(bh / kv_heads);
    const float* at = parts + r * kPadDim + 4 * c;
    float4 sum = *reinterpret_cast<const float4*>(at);
    for (int s = 1; s < a.group_split; ++s) {
      const float4 x = *reinterpret_cast<const float4*>(at + s * slice);
      sum.x += x.x;
      sum.y += x.y;
      sum.z += x.z;
      sum.w += x.w;
    }
    *reinterpret_cast<uint2*>(out + batch * batch_stride + kv_head * head_stride + row * row_stride + 4 * c) =
        uint2{pack2<Element>(sum.x * scale, sum.y * scale), pack2<Element>(sum.z * scale, sum.w * scale)};
  }
}

template <Half16 Element, int kPadDim>
cudaError_t launch_bwd_sum_dkv(const BwdArgs& a, cudaStream_t stream) {
  const std::int64_t total =
      static_cast<std::int64_t>(a.f.batch) * (a.f.heads / a.f.group) * a.f.k_rows * (a.head_dim / 4);
  const std::int64_t blocks = (total + 255) / 256;
  return launch_after_prior(flash_bwd_sum_dkv_kernel<Element, kPadDim>,
                            dim3(static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8), 2), 256, 0, stream, a);
}

}  // namespace attnprof::cuda::kernels
