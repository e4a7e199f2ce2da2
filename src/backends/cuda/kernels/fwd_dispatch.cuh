// The one place where the runtime choices of a fused forward (element type,
// head_dim, mask, whether the LSE is asked for) become template parameters.
// A Runner supplies
//   template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
//   static cudaError_t run(const FwdArgs&, cudaStream_t);
// over the head dims of kFusedHeadDims (fused_params.h), or of another list
// (kFlashSm90HeadDims) given as dispatch_fwd's second argument.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "backends/cuda/fused_params.h"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

template <class Runner, int kHeadDim, Half16 Element, MaskMode kMask>
cudaError_t dispatch_lse(const FwdArgs& a, cudaStream_t stream) {
  return a.lse != nullptr ? Runner::template run<kHeadDim, kMask, Element, true>(a, stream)
                          : Runner::template run<kHeadDim, kMask, Element, false>(a, stream);
}

template <class Runner, int kHeadDim, Half16 Element>
cudaError_t dispatch_mask(const FwdArgs& a, MaskKind mask, cudaStream_t stream) {
  return with_mask_mode(mask, cudaErrorInvalidValue,
                        [&]<MaskMode kMask>() { return dispatch_lse<Runner, kHeadDim, Element, kMask>(a, stream); });
}

template <class Runner, const auto& kDims, Half16 Element, std::size_t... kI>
cudaError_t dispatch_head_dim(const FwdArgs& a, int head_dim, MaskKind mask, cudaStream_t stream,
                              std::index_sequence<kI...>) {
  cudaError_t result = cudaErrorInvalidValue;
  (void)((head_dim == kDims[kI] && (result = dispatch_mask<Runner, kDims[kI], Element>(a, mask, stream), true)) || ...);
  return result;
}

template <class Runner, const auto& kDims = kFusedHeadDims>
cudaError_t dispatch_fwd(const FusedParams& p, cudaStream_t stream) {
  const FwdArgs a = FwdArgs::from(p);
  constexpr auto kHeadDims = std::make_index_sequence<kDims.size()>();
  return p.bf16 ? dispatch_head_dim<Runner, kDims, Bf16>(a, p.head_dim, p.mask, stream, kHeadDims)
                : dispatch_head_dim<Runner, kDims, Fp16>(a, p.head_dim, p.mask, stream, kHeadDims);
}

}  // namespace attnprof::cuda::kernels
