// flash's sm90a backward (kernels/flash_bwd_sm90.cuh) at head_dim 192, every
// mask and element type (one head dim a translation unit: they compile in parallel).
#include "backends/cuda/kernels/flash_bwd_sm90.cuh"

namespace attnprof::cuda::kernels {
ATTNPROF_BWD_INSTANTIATE(launch_flash_bwd_sm90, 192)
}  // namespace attnprof::cuda::kernels
