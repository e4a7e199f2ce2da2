// The backwards' last kernel when dQ was summed into the FP32 accumulator
// (flash_bwd_sm80.cuh, flash_bwd_sm90.cuh): the accumulator, already scaled,
// to dQ in the element type. Eight elements a thread: two 16-byte loads, one
// 16-byte store (the issue 21 profile read the scalar version at a fifth of
// the bandwidth).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels {

// The dQ accumulator ([B, H, rows_pad, D] f32) into dQ, rows < seq_q.
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
    const auto* acc = reinterpret_cast<const float4*>(a.dq_accum + (bh * a.rows_pad + i) * a.head_dim + 8 * c);
    const float4 lo = acc[0], hi = acc[1];
    const uint4 out{pack2<Element>(lo.x, lo.y), pack2<Element>(lo.z, lo.w), pack2<Element>(hi.x, hi.y),
                    pack2<Element>(hi.z, hi.w)};
    *reinterpret_cast<uint4*>(a.dq + batch * a.dq_batch_stride + head * a.dq_head_stride + i * a.dq_row_stride +
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

}  // namespace attnprof::cuda::kernels
