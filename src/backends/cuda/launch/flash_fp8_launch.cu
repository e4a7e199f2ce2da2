// Host entry of flash's FP8 (e4m3) forward on sm90a: V^T by the pre-pass
// (kernels/transpose_v_fp8.cuh), then the kernel (kernels/flash_fwd_sm90_fp8.cuh,
// instantiated in flash_fwd_sm90_fp8_hdim*.cu).
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/kernels/transpose_v_fp8.cuh"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof::cuda {

cudaError_t launch_flash_sm90_fp8(const FusedParams& p, cudaStream_t stream) {
  if (!p.fp8 || p.v_t == nullptr || p.head_dim != kFlashFp8HeadDim) return cudaErrorInvalidValue;
  if (const cudaError_t e = kernels::launch_transpose_v_e4m3(
          p.v, p.v_batch_stride, p.v_head_stride, p.v_row_stride, p.v_t, p.batch, p.kv_heads, p.seq_k,
          static_cast<int>(fp8_vt_cols(p.seq_k)), p.head_dim, stream);
      e != cudaSuccess) {
    return e;
  }
  const kernels::FwdArgs a = kernels::fp8_fwd_args(p);
  return kernels::with_mask_mode(p.mask, cudaErrorInvalidValue, [&]<kernels::MaskMode kMask>() {
    return kernels::launch_flash_fwd_sm90_fp8<kFlashFp8HeadDim, kMask>(a, p.v_descale, stream);
  });
}

}  // namespace attnprof::cuda
