// The runtime choices of a fused kernel made template constants, each written
// once (in the manner of FlashAttention-3's static_switch.h, as functions that
// take a callable instead of macros): with_head_dim serves the forwards
// (fwd_dispatch.cuh), the backward (fused_bwd_launch.cu) and decode
// (flash_decode_launch.cu); with_element the element type. The mask's is
// with_mask_mode (fwd_args.cuh), beside the MaskMode it maps to.
//
//   with_head_dim<kFusedHeadDims>(p.head_dim, cudaErrorInvalidValue, [&]<int kD>() { return run<kD>(...); });
//
// The callables capture by reference ([&]) even when they need nothing: nvcc
// warns (#445-D) about a captureless template lambda's conversion to a
// function pointer.
#pragma once

#include <cstddef>
#include <utility>

#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels {

// f.template operator()<D>() at the head dim D of kHeadDims (a constexpr
// array: fused_params.h's lists) that equals head_dim; `otherwise` when none
// does (a head dim with no instance built).
template <const auto& kHeadDims, class R, class F>
R with_head_dim(int head_dim, R otherwise, F&& f) {
  return [&]<std::size_t... kI>(std::index_sequence<kI...>) {
    R result = otherwise;
    (void)((head_dim == kHeadDims[kI] && (result = f.template operator()<kHeadDims[kI]>(), true)) || ...);
    return result;
  }
  (std::make_index_sequence<kHeadDims.size()>());
}

// f.template operator()<Element>() with the element tag (element.cuh) of
// the tensors: Bf16, else Fp16.
template <class F>
decltype(auto) with_element(bool bf16, F&& f) {
  return bf16 ? f.template operator()<Bf16>() : f.template operator()<Fp16>();
}

}  // namespace attnprof::cuda::kernels
