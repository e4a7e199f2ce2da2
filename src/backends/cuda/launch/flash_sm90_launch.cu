// Host entry of the flash forward's sm90a path (FlashAttention-3 class,
// kernels/flash_fwd_sm90.cuh); its kernels are instantiated in
// flash_fwd_sm90_hdim*.cu, one file per head dim of kFlashSm90HeadDims.
#include "backends/cuda/kernels/fwd_dispatch.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof::cuda {
namespace {

struct FlashSm90Runner {
  template <int kHeadDim, kernels::MaskMode kMask, kernels::Half16 Element, bool kLse>
  static cudaError_t run(const kernels::FwdArgs& a, cudaStream_t stream) {
    return kernels::launch_flash_fwd_sm90<kHeadDim, kMask, Element, kLse>(a, stream);
  }
};

// Built with the same architectures as the sm90 kernels: it has sm90 machine
// code exactly when they do.
__global__ void sm90_image_probe() {}

}  // namespace

// Whether this binary holds the kernels as sm90 machine code for the current
// device: a build for sm_80 alone (or a newer GPU) would find an empty body.
bool flash_sm90_runs_here() {
  static const bool runs = [] {
    cudaFuncAttributes attr{};
    const bool ok = cudaFuncGetAttributes(&attr, sm90_image_probe) == cudaSuccess && attr.binaryVersion == 90;
    cudaGetLastError();  // a missing image is an answer here, not an error for the next call
    return ok;
  }();
  return runs;
}

FlashPath flash_path(const FusedParams& p) {
  if (p.fp8) return FlashPath::Sm90;
  if (flash_decode_takes(p)) return FlashPath::Decode;
  return flash_sm90_head_dim(p.head_dim) && flash_sm90_runs_here() ? FlashPath::Sm90 : FlashPath::Sm80;
}

bool flash_sm90_applies(const FusedParams& p) {
  return flash_path(p) == FlashPath::Sm90 && fused_unsupported_reason(p, /*flash=*/true) == nullptr;
}

cudaError_t launch_flash_sm90(const FusedParams& p, cudaStream_t stream) {
  if (!flash_sm90_applies(p)) return cudaErrorNotSupported;
  return kernels::dispatch_fwd<FlashSm90Runner, kFlashSm90HeadDims>(p, stream);
}

cudaError_t launch_flash(const FusedParams& p, cudaStream_t stream) {
  if (fused_unsupported_reason(p, /*flash=*/true) != nullptr) return cudaErrorInvalidValue;
  return launch_flash_checked(p, flash_decode_takes(p) ? flash_decode_plan(p) : DecodePlan{}, stream);
}

cudaError_t launch_flash_checked(const FusedParams& p, const DecodePlan& plan, cudaStream_t stream) {
  switch (flash_path(p)) {
    case FlashPath::Decode:
      return launch_flash_decode_planned(p, plan, stream);
    case FlashPath::Sm90: {
      if (p.fp8) return launch_flash_sm90_fp8(p, stream);
      const cudaError_t e = kernels::dispatch_fwd<FlashSm90Runner, kFlashSm90HeadDims>(p, stream);
      // Not launched (a register budget setmaxnreg cannot have, run_flash_fwd_sm90):
      // the sm80 kernel runs instead where one is built.
      // (Not for what the sm80 kernel does not read: soft caps.)
      if (e == cudaErrorNotSupported && fused_head_dim_built(p.head_dim) && !(p.softcap > 0.f)) {
        return launch_flash_sm80_checked(p, stream);
      }
      return e;
    }
    case FlashPath::Sm80:
      return launch_flash_sm80_checked(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attnprof::cuda
