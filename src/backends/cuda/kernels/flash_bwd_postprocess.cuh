// The backwards' last kernel when dQ was summed into the FP32 accumulator
// (flash_bwd_sm80.cuh, flash_bwd_sm90.cuh): the accumulator, already scaled,
// to dQ in the element type, vectorised (the issue 21 profile read the
// scalar version at a fifth of the bandwidth). sm80's accumulator is
// row-major; sm90's 64-row tiles are in its register order (DqTileLayout,
// epilogue_bwd_sm90.cuh), read here 16 bytes a thread in that order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/epilogue_bwd_sm90.cuh"
#include "backends/cuda/kernels/flash_bwd_preprocess.cuh"

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

// sm90's tiled accumulator into dQ: one thread a fragment slot (a lane's four
// floats of one n-tile: rows g and g + 8, columns 2t and 2t + 1); x blocks of
// 256 slots of one (batch, head)'s 64-row tiles, y the (batch, head) pairs.
template <Half16 Element, int kPadDim>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_tiled_kernel(const __grid_constant__ BwdArgs a) {
  constexpr int kDqCols = kPadDim / 2, kDqTiles = kDqCols / 8, kSlots = 64 * kPadDim / 4;  // float4s a tile
  constexpr int kBlocksPerTile = kSlots / 256;
  static_assert(kSlots % 256 == 0, "whole blocks a tile");
  const FwdArgs& f = a.f;
  const int tile = static_cast<int>(blockIdx.x) / kBlocksPerTile;  // within the (batch, head)
  // The slot (e, in the order the kernel staged them) and its place in the tile.
  const int e = static_cast<int>(blockIdx.x) % kBlocksPerTile * 256 + static_cast<int>(threadIdx.x);
  const int lane = e % 32, nt = e / 32 % kDqTiles, warp = e / 32 / kDqTiles % 4, wg = e / 32 / kDqTiles / 4;
  const int row = tile * 64 + warp * 16 + lane / 4;
  const int col = consumer_column<kPadDim>(wg, nt) + 2 * (lane % 4);
  if (col >= a.head_dim) return;
  for (int bh = blockIdx.y; bh < f.batch * f.heads; bh += gridDim.y) {
    const int head = bh % f.heads, batch = bh / f.heads;
    const BwdArgs seq = a.sequence(batch);  // the rows' sequence (packed batches)
    if (row >= seq.f.seq_q) continue;
    const std::int64_t at = (static_cast<std::int64_t>(bh) * a.rows_pad + tile * 64) * kPadDim;
    const float4 v =
        *reinterpret_cast<const float4*>(a.dq_accum + at + DqTileLayout<kDqTiles>::offset(wg, warp, nt, lane));
    std::uint16_t* const out =
        seq.dq + batch * seq.dq_batch_stride + head * seq.dq_head_stride + row * seq.dq_row_stride + col;
    *reinterpret_cast<std::uint32_t*>(out) = pack2<Element>(v.x, v.y);
    if (row + 8 < seq.f.seq_q)
      *reinterpret_cast<std::uint32_t*>(out + 8 * seq.dq_row_stride) = pack2<Element>(v.z, v.w);
  }
}

template <Half16 Element, int kPadDim>
cudaError_t launch_bwd_convert_dq_tiled(const BwdArgs& a, cudaStream_t stream) {
  flash_bwd_convert_dq_tiled_kernel<Element, kPadDim>
      <<<bwd_rows_grid(a, static_cast<std::int64_t>(a.rows_pad / 64) * (64 * kPadDim / 4 / 256)), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace attnprof::cuda::kernels
