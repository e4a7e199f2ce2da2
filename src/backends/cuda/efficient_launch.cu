// Host entry of the memory-efficient fused forward: every (dtype, head_dim,
// mask) instantiation of efficient_fwd_kernel lives in this translation unit.
#include "backends/cuda/fused_kernels.h"
#include "backends/cuda/kernels/efficient_fwd.cuh"
#include "backends/cuda/kernels/fwd_dispatch.cuh"

namespace attnprof::cuda {
namespace {

struct EfficientRunner {
  template <int kHeadDim, kernels::MaskMode kMask, bool kBf16>
  static cudaError_t run(const kernels::FwdArgs& a, cudaStream_t stream) {
    return kernels::run_efficient_fwd<kernels::EfficientDefaultCfg<kHeadDim>, kMask, kBf16>(a, stream);
  }
};

}  // namespace

cudaError_t launch_efficient(const FusedParams& p, cudaStream_t stream) {
  if (fused_unsupported_reason(p, /*flash=*/false) != nullptr) return cudaErrorInvalidValue;
  return kernels::dispatch_fwd<EfficientRunner>(p, stream);
}

}  // namespace attnprof::cuda
