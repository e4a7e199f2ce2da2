// The one place where the runtime choices of a fused forward (element type,
// head_dim, mask, whether the LSE is asked for) become template parameters.
// A Runner supplies
//   template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
//   static cudaError_t run(const FwdArgs&, cudaStream_t);
// over the head dims of kFusedHeadDims (fused_params.h), or of another list
// (kFlashSm90HeadDims) given as dispatch_fwd's second argument.
#pragma once

#include <cuda_runtime_api.h>

#include "backends/cuda/fused_params.h"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/static_switch.cuh"

namespace attnprof::cuda::kernels {

template <class Runner, const auto& kDims = kFusedHeadDims>
cudaError_t dispatch_fwd(const FusedParams& p, cudaStream_t stream) {
  const FwdArgs a = FwdArgs::from(p);
  return with_element(p.bf16, [&]<Half16 Element>() {
    return with_head_dim<kDims>(p.head_dim, cudaErrorInvalidValue, [&]<int kHeadDim>() {
      return with_mask_mode(p.mask, cudaErrorInvalidValue, [&]<MaskMode kMask>() {
        return a.lse != nullptr ? Runner::template run<kHeadDim, kMask, Element, true>(a, stream)
                                : Runner::template run<kHeadDim, kMask, Element, false>(a, stream);
      });
    });
  });
}

}  // namespace attnprof::cuda::kernels
