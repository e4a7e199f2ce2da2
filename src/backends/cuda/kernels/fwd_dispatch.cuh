// The one place where the runtime choices of a fused forward (dtype, head_dim,
// mask) become template parameters. A Runner supplies
//   template <int kHeadDim, MaskMode kMask, bool kBf16>
//   static cudaError_t run(const FwdArgs&, cudaStream_t);
// and each launch .cu instantiates this for its kernel only, so the two
// kernels compile in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include "backends/cuda/fused_params.h"
#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

template <class Runner, int kHeadDim, bool kBf16>
cudaError_t dispatch_mask(const FwdArgs& a, FusedMask mask, cudaStream_t stream) {
  switch (mask_mode(mask)) {
    case MaskMode::None: return Runner::template run<kHeadDim, MaskMode::None, kBf16>(a, stream);
    case MaskMode::Causal: return Runner::template run<kHeadDim, MaskMode::Causal, kBf16>(a, stream);
    case MaskMode::Window: return Runner::template run<kHeadDim, MaskMode::Window, kBf16>(a, stream);
  }
  return cudaErrorInvalidValue;
}

template <class Runner, bool kBf16>
cudaError_t dispatch_head_dim(const FwdArgs& a, int head_dim, FusedMask mask, cudaStream_t stream) {
  switch (head_dim) {
    case 32: return dispatch_mask<Runner, 32, kBf16>(a, mask, stream);
    case 64: return dispatch_mask<Runner, 64, kBf16>(a, mask, stream);
    case 96: return dispatch_mask<Runner, 96, kBf16>(a, mask, stream);
    case 128: return dispatch_mask<Runner, 128, kBf16>(a, mask, stream);
    case 256: return dispatch_mask<Runner, 256, kBf16>(a, mask, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <class Runner>
cudaError_t dispatch_fwd(const FusedParams& p, cudaStream_t stream) {
  const FwdArgs a = FwdArgs::from(p);
  return p.bf16 ? dispatch_head_dim<Runner, true>(a, p.head_dim, p.mask, stream)
                : dispatch_head_dim<Runner, false>(a, p.head_dim, p.mask, stream);
}

}  // namespace attnprof::cuda::kernels
