// How the fused backwards are launched: launch_flash_bwd_sm80 (the three
// kernels of one backward, flash_bwd_sm80.cuh) and launch_flash_bwd_sm90
// (flash_bwd_sm90.cuh) are explicitly instantiated, for every mask and
// element type, in one translation unit per head dim
// (src/backends/cuda/instantiations/flash_bwd_sm80_hdim<D>.cu and flash_bwd_sm90_hdim<D>.cu,
// ATTNPROF_BWD_INSTANTIATE), so that the dispatching file
// (fused_bwd_launch.cu) sees these declarations only.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

// The kernels of one backward on `stream`: preprocess, dK/dV (with atomic dQ
// unless deterministic), then the dQ conversion or, deterministic, the dQ kernel.
template <int kHeadDim, MaskMode kMask, Half16 Element>
cudaError_t launch_flash_bwd_sm80(const BwdArgs& a, cudaStream_t stream);

// The same on sm90a: preprocess, the warp-specialised dK/dV/dQ kernel, the dQ
// conversion; cudaErrorNotSupported (nothing launched) when the register
// split cannot hold.
template <int kHeadDim, MaskMode kMask, Half16 Element>
cudaError_t launch_flash_bwd_sm90(const BwdArgs& a, cudaStream_t stream);

// Explicit instantiations of `fn` at one head dim, every mask and element type.
#define ATTNPROF_BWD_INSTANTIATE_ONE(fn, head_dim, mask, element) \
  template cudaError_t fn<head_dim, mask, element>(const BwdArgs&, cudaStream_t);
#define ATTNPROF_BWD_INSTANTIATE(fn, head_dim)                       \
  ATTNPROF_BWD_INSTANTIATE_ONE(fn, head_dim, MaskMode::None, Bf16)   \
  ATTNPROF_BWD_INSTANTIATE_ONE(fn, head_dim, MaskMode::Causal, Bf16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(fn, head_dim, MaskMode::Window, Bf16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(fn, head_dim, MaskMode::None, Fp16)   \
  ATTNPROF_BWD_INSTANTIATE_ONE(fn, head_dim, MaskMode::Causal, Fp16) \
  ATTNPROF_BWD_INSTANTIATE_ONE(fn, head_dim, MaskMode::Window, Fp16)

}  // namespace attnprof::cuda::kernels
