// How the fused backward is launched: launch_flash_bwd_sm80, the three kernels
// of one backward, is defined in flash_bwd_sm80.cuh and explicitly
// instantiated, for every mask and element type, in one translation unit per
// head dim (src/backends/cuda/fused_bwd_hdim<D>.cu, ATTNPROF_BWD_INSTANTIATE),
// so that the dispatching file (fused_bwd_launch.cu) sees this declaration only.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

// The kernels of one backward on `stream`: preprocess, dK/dV (with atomic dQ
// unless BwdArgs::dq_accum is null), then the dQ conversion or, deterministic,
// the dQ kernel.
template <int kHeadDim, MaskMode kMask, Half16 Element>
cudaError_t launch_flash_bwd_sm80(const BwdArgs& a, cudaStream_t stream);

// Explicit instantiations of launch_flash_bwd_sm80 at one head dim, every
// mask and element type.
#define ATTNPROF_BWD_INSTANTIATE_ONE(head_dim, mask, element) \
  template cudaError_t launch_flash_bwd_sm80<head_dim, mask, element>(const BwdArgs&, cudaStream_t);
#define ATTNPROF_BWD_INSTANTIATE(head_dim)                       \
  ATTNPROF_BWD_INSTANTIATE_ONE(head_dim, MaskMode::None, Bf16)   \
  ATTNPROF_BWD_INSTANTIATE_ONE(head_dim, MaskMode::Causal, Bf16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(head_dim, MaskMode::Window, Bf16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(head_dim, MaskMode::None, Fp16)   \
  ATTNPROF_BWD_INSTANTIATE_ONE(head_dim, MaskMode::Causal, Fp16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(head_dim, MaskMode::Window, Fp16)

}  // namespace attnprof::cuda::kernels
