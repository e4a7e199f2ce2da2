// flash's sm90a forward on e4m3 inputs at head_dim 128, every mask
// (kernels/flash_fwd_sm90_fp8.cuh).
#include "backends/cuda/kernels/flash_fwd_sm90_fp8.cuh"

namespace attnprof::cuda::kernels {
ATTNPROF_FWD_FP8_INSTANTIATE(128)
}  // namespace attnprof::cuda::kernels
