// flash's sm80 forward at head_dim 128, every mask and element type, with
// and without the LSE (one head dim a translation unit keeps a build on few cores quick).
#include "backends/cuda/kernels/flash_fwd_sm80.cuh"

namespace attnprof::cuda::kernels {
ATTNPROF_FWD_INSTANTIATE(launch_flash_fwd_sm80, 128)
}  // namespace attnprof::cuda::kernels
