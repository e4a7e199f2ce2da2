// The backward's last kernel when dQ was summed with atomics
// (flash_bwd_sm80.cuh): the FP32 accumulator to dQ in the element type.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels {

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

}  // namespace attnprof::cuda::kernels
