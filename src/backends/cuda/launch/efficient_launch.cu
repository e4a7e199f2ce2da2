// Host entry of the memory-efficient fused forward; its kernels are
// instantiated in efficient_fwd_hdim*.cu, one file per head dim.
#include "backends/cuda/kernels/fwd_dispatch.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof::cuda {
namespace {

struct EfficientRunner {
  template <int kHeadDim, kernels::MaskMode kMask, kernels::Half16 Element, bool kLse>
  static cudaError_t run(const kernels::FwdArgs& a, cudaStream_t stream) {
    return kernels::launch_efficient_fwd<kHeadDim, kMask, Element, kLse>(a, stream);
  }
};

}  // namespace

cudaError_t launch_efficient(const FusedParams& p, cudaStream_t stream) {
  if (fused_unsupported_reason(p, /*flash=*/false) != nullptr) return cudaErrorInvalidValue;
  return launch_efficient_checked(p, stream);
}

cudaError_t launch_efficient_checked(const FusedParams& p, cudaStream_t stream) {
  return kernels::dispatch_fwd<EfficientRunner>(p, stream);
}

}  // namespace attnprof::cuda
