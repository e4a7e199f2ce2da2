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

namespace attnprof::cuda::kernels {

// The dQ accumulator ([B, H, rows_pad, D] f32) into dQ, rows < seq_q (each
// sequence's own, packed batches).
template <Half16 Element>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_kernel(const __grid_constant__ BwdArgs a) {
  const FwdArgs& f = a.f;
  const int chunks = a.head_dim / 8;
  const std::int64_t n = static_cast<std::int64_t>(f.batch) * f.heads * f.seq_q * chunks;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(e % chunks);
    const std::int64_t r = e / chunks;
    const int i = static_cast<int>(r % f.seq_q);
    const std::int64_t bh = r / f.seq_q;
    const int head = static_cast<int>(bh % f.heads), batch = static_cast<int>(bh / f.heads);
    const BwdArgs seq = a.sequence(batch);  // the row's sequence (packed batches)
    if (i >= seq.f.seq_q) continue;
    const auto* acc = reinterpret_cast<const float4*>(a.dq_accum + (bh * a.rows_pad + i) * a.head_dim + 8 * c);
    const float4 lo = acc[0], hi = acc[1];
    const uint4 out{pack2<Element>(lo.x, lo.y), pack2<Element>(lo.z, lo.w), pack2<Element>(hi.x, hi.y),
                    pack2<Element>(hi.z, hi.w)};
    *reinterpret_cast<uint4*>(seq.dq + batch * seq.dq_batch_stride + head * seq.dq_head_stride + i * seq.dq_row_stride +
                              8 * c) = out;
  }
}

template <Half16 Element>
cudaError_t launch_bwd_convert_dq(const BwdArgs& a, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(a.f.batch) * a.f.heads * a.f.seq_q * (a.head_dim / 8);
  const std::int64_t blocks = (n + 255) / 256;
  flash_bwd_convert_dq_kernel<Element>
      <<<static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

// sm90's tiled accumulator into dQ: one thread a fragment slot (a lane's four
// floats of one n-tile: rows g and g + 8, columns 2t and 2t + 1).
template <Half16 Element, int kPadDim>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_tiled_kernel(const __grid_constant__ BwdArgs a) {
  constexpr int kDqCols = kPadDim / 2, kDqTiles = kDqCols / 8, kSlots = 64 * kPadDim / 4;  // float4s a tile
  const FwdArgs& f = a.f;
  const std::int64_t n = static_cast<std::int64_t>(f.batch) * f.heads * (a.rows_pad / 64) * kSlots;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t tile = e / kSlots;
    int q = static_cast<int>(e % kSlots);
    const int lane = q % 32;
    q /= 32;
    const int nt = q % kDqTiles;
    q /= kDqTiles;
    const int warp = q % 4, wg = q / 4;
    const std::int64_t bh = tile / (a.rows_pad / 64);
    const int row = static_cast<int>(tile % (a.rows_pad / 64)) * 64 + warp * 16 + lane / 4;
    const int col = consumer_column<kPadDim>(wg, nt) + 2 * (lane % 4);
    const int head = static_cast<int>(bh % f.heads), batch = static_cast<int>(bh / f.heads);
    const BwdArgs seq = a.sequence(batch);  // the rows' sequence (packed batches)
    if (col >= a.head_dim || row >= seq.f.seq_q) continue;
    // The slot's floats, where the kernel staged them (e is that slot, in order).
    const float4 v = *reinterpret_cast<const float4*>(a.dq_accum + tile * 64 * kPadDim +
                                                      DqTileLayout<kDqTiles>::offset(wg, warp, nt, lane));
    std::uint16_t* const out =
        seq.dq + batch * seq.dq_batch_stride + head * seq.dq_head_stride + row * seq.dq_row_stride + col;
    *reinterpret_cast<std::uint32_t*>(out) = pack2<Element>(v.x, v.y);
    if (row + 8 < seq.f.seq_q)
      *reinterpret_cast<std::uint32_t*>(out + 8 * seq.dq_row_stride) = pack2<Element>(v.z, v.w);
  }
}

template <Half16 Element, int kPadDim>
cudaError_t launch_bwd_convert_dq_tiled(const BwdArgs& a, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(a.f.batch) * a.f.heads * a.rows_pad * kPadDim / 4;
  const std::int64_t blocks = (n + 255) / 256;
  flash_bwd_convert_dq_tiled_kernel<Element, kPadDim>
      <<<static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace attnprof::cuda::kernels
