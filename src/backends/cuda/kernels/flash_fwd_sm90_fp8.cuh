// flash's sm90a forward on FP8 (e4m3) inputs: the TMA/wgmma kernel of
// flash_fwd_sm90.cuh instantiated for E4m3 (its mainloop's FP8 notes say
// what changes); the pre-pass that gives it V^T is transpose_v_fp8.cuh.
//
// e4m3 wgmma reads both operands K-major, and P V reduces over the keys, so
// V [B, Hkv, Skv, D] is written once a forward as V^T [B, Hkv, D, Skv16]
// (Skv16 = fp8_vt_cols(Skv), the keys past Skv zero). Within every 16 keys
// the columns are permuted: column c holds key kKeyOfColumn(c). That is the
// key each S accumulator packed in its own order stands for in the wgmma A
// fragment (mma.m16n8k32's 8-bit A: thread t of a quad holds columns
// 4t..4t+3; its accumulators hold keys 2t, 2t+1 of n-tile 0 and the same of
// n-tile 1, i.e. keys 2t, 2t+1, 8+2t, 9+2t), so P needs no shuffles between
// the two products. (FlashAttention-3 transposes V in shared memory in the
// producer and permutes P's registers; the pre-pass costs one read and one
// write of V, ~2% of a forward at 8k keys, and keeps the producer a TMA thread.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/flash_fwd_sm90.cuh"

namespace attnprof::cuda::kernels {

// The FP8 kernel's tiles: the 16-bit D = 128 default's (128 query rows,
// producer warpgroup, pingpong, intra-warpgroup overlap), kBlockN keys a
// tile, kFmaExp2 of every 8 n-tiles' exponentials on the FMA pipe, and the
// overlapped loop's rescale skip. Measured (docs/perf/fp8-2026-12-02.md, H200):
// 192-key tiles (FlashAttention-3 takes 224) are 3-6% faster from 4k keys up
// and 5% slower at 1k (a ragged last tile); one n-tile of 8 on the FMA pipe
// gains 2%, two lose 2-4%; the skip is within noise.
template <int kHeadDim, int kFmaExp2 = 1, int kBlockN = 128, bool kSkipRescale = false>
using FlashSm90Fp8Cfg = FlashSm90Cfg<kHeadDim, kBlockN, 2, 2, kSkipRescale, true, true, true, kFmaExp2, false, true>;
// Keys from which the 192-key tiles run.
inline constexpr int kFp8WideTileKeys = 2048;

// The forward on e4m3 Q, K and V^T (fp8_fwd_args, fwd_args.cuh), V's descale o_scale.
template <int kHeadDim, MaskMode kMask>
cudaError_t launch_flash_fwd_sm90_fp8(const FwdArgs& a, float o_scale, cudaStream_t stream) {
  if (a.seq_k >= kFp8WideTileKeys) {
    return run_flash_fwd_sm90<FlashSm90Fp8Cfg<kHeadDim, 1, 192, true>, kMask, E4m3>(a, stream, o_scale);
  }
  return run_flash_fwd_sm90<FlashSm90Fp8Cfg<kHeadDim>, kMask, E4m3>(a, stream, o_scale);
}

#define ATTNPROF_FWD_FP8_INSTANTIATE(head_dim)                                                                     \
  template cudaError_t launch_flash_fwd_sm90_fp8<head_dim, MaskMode::None>(const FwdArgs&, float, cudaStream_t);   \
  template cudaError_t launch_flash_fwd_sm90_fp8<head_dim, MaskMode::Causal>(const FwdArgs&, float, cudaStream_t); \
  template cudaError_t launch_flash_fwd_sm90_fp8<head_dim, MaskMode::Window>(const FwdArgs&, float, cudaStream_t);

}  // namespace attnprof::cuda::kernels
