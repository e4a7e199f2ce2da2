// The fused backward (kernels/flash_bwd_sm80.cuh) at head_dim 32, every mask
// and element type (one head dim a translation unit: the kernels compile in parallel).
#include "backends/cuda/kernels/flash_bwd_sm80.cuh"

namespace attnprof::cuda::kernels {
ATTNPROF_BWD_INSTANTIATE(launch_flash_bwd_sm80, 32)
}  // namespace attnprof::cuda::kernels
