// Host entry of the flash forward's sm90a path (FlashAttention-3 class,
// kernels/flash_fwd_sm90.cuh): every (dtype, head_dim, mask) instantiation of
// flash_fwd_sm90_kernel lives in this translation unit.
#include "backends/cuda/fused_kernels.h"
#include "backends/cuda/kernels/flash_fwd_sm90.cuh"
#include "backends/cuda/kernels/fwd_dispatch.cuh"

namespace attnprof::cuda {
namespace {

constexpr bool sm90_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128; }

struct FlashSm90Runner {
  template <int kHeadDim, kernels::MaskMode kMask, bool kBf16>
  static cudaError_t run(const kernels::FwdArgs& a, cudaStream_t stream) {
    if constexpr (sm90_head_dim(kHeadDim)) {
      return kernels::run_flash_fwd_sm90<kernels::FlashSm90DefaultCfg<kHeadDim>, kMask, kBf16>(a, stream);
    } else {
      return cudaErrorNotSupported;
    }
  }
};

// Whether this binary holds the kernel as sm90a machine code for the current
// device: a build for sm_80 alone (or a newer GPU) would find an empty body.
bool sm90_kernel_runs_here() {
  static const bool runs = [] {
    cudaFuncAttributes attr{};
    const auto kernel = kernels::flash_fwd_sm90_kernel<kernels::FlashSm90DefaultCfg<64>, kernels::MaskMode::None, true>;
    const bool ok = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
    cudaGetLastError();  // a missing image is an answer here, not an error for the next call
    return ok;
  }();
  return runs;
}

}  // namespace

bool flash_sm90_applies(const FusedParams& p) {
  return sm90_head_dim(p.head_dim) && sm90_kernel_runs_here() && fused_unsupported_reason(p, /*flash=*/true) == nullptr;
}

cudaError_t launch_flash_sm90(const FusedParams& p, cudaStream_t stream) {
  if (!flash_sm90_applies(p)) return cudaErrorNotSupported;
  return kernels::dispatch_fwd<FlashSm90Runner>(p, stream);
}

cudaError_t launch_flash(const FusedParams& p, cudaStream_t stream) {
  if (fused_unsupported_reason(p, /*flash=*/true) != nullptr) return cudaErrorInvalidValue;
  // One check per call: the choice needs only the head_dim and the binary.
  return sm90_head_dim(p.head_dim) && sm90_kernel_runs_here() ? kernels::dispatch_fwd<FlashSm90Runner>(p, stream)
                                                              : launch_flash_sm80_checked(p, stream);
}

}  // namespace attnprof::cuda
