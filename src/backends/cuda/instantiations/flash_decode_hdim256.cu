// Flash's split-KV decode kernels at head_dim 256 (kernels/flash_decode.cuh).
#include "backends/cuda/kernels/flash_decode.cuh"

namespace attnprof::cuda::kernels {
ATTNPROF_DECODE_INSTANTIATE(template, 256)
}  // namespace attnprof::cuda::kernels
