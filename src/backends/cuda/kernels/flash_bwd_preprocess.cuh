// The backward's first kernel (flash_bwd_sm80.cuh): D = rowsum(dO * O), the
// term of dS = P (dP - D), per query row; and the FP32 dQ accumulator zeroed
// (no cudaMemset).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels {

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

}  // namespace attnprof::cuda::kernels
