// ragged_offsets.h: one thread a sequence boundary.
#include <cuda_runtime.h>

#include "backends/cuda/fused_params.h"
#include "backends/cuda/ops/ops_common.h"
#include "backends/cuda/ops/ragged_offsets.h"
#include "core/mask_geometry.h"

namespace attnprof::cuda {
namespace {

__global__ void ragged_offsets_kernel(const RaggedOffsetsArgs a) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;  // 0 .. batch
  if (b > a.batch) return;
  // Offset b is sequence b's first row; offset batch the last sequence's end.
  const int s = b < a.batch ? b : a.batch - 1;
  int q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  bool ok = true;
  if (s >= 0) {
    const auto q = geometry::packed_rows(a.cu_q, s, a.batch, a.total_q, a.max_q);
    const auto k = geometry::packed_rows(a.cu_k, s, a.batch, a.total_k, a.max_k);
    q0 = q.rows.begin, q1 = q.rows.end, k0 = k.rows.begin, k1 = k.rows.end;
    ok = q.exact && k.exact;
  }
  const int q_row = b < a.batch ? q0 : q1, k_row = b < a.batch ? k0 : k1;
  for (int i = 0; i < a.count; ++i) {
    a.out[i * (a.batch + 1) + b] = static_cast<std::int32_t>((a.query[i] ? q_row : k_row) * a.row_stride[i]);
  }
  if (b < a.batch) {
    std::int32_t* lengths = a.out + a.count * (a.batch + 1);
    lengths[b] = q1 - q0;
    lengths[a.batch + b] = k1 - k0;
    if (!ok && a.input_errors != nullptr) atomicOr(a.input_errors, kInputBadCuSeqlens);
  }
}

}  // namespace

void ragged_offsets(const RaggedOffsetsArgs& a, void* stream) {
  const int threads = 128, blocks = (a.batch + 1 + threads - 1) / threads;
  ragged_offsets_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  ops::detail::check_launch();
}

}  // namespace attnprof::cuda
