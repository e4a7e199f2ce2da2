// Host-side arguments of the fused attention kernels (efficient, flash), and
// the head dims they are built for. Plain data so that kernels depend on
// nothing above them.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace attnprof::cuda {

// The head dims every fused kernel is instantiated for (one translation unit
// per kernel and head dim: src/backends/cuda/*_hdim*.cu), and the subset that
// flash's sm90a kernel takes (its tiles need whole 64-column swizzle regions
// and a wgmma N of 64 or 128). Dispatch, the eligibility checks and the tests
// read these lists; adding a head dim means adding its instance files.
inline constexpr std::array<int, 5> kFusedHeadDims = {32, 64, 96, 128, 256};
inline constexpr std::array<int, 2> kFlashSm90HeadDims = {64, 128};
// The head dims the fused backward is built for (src/backends/cuda/fused_bwd_hdim*.cu).
// 256 is left out: dK and dV of a warp's 16 keys alone would be 256 f32 a thread.
inline constexpr std::array<int, 4> kFusedBwdHeadDims = {32, 64, 96, 128};

constexpr bool fused_head_dim_built(int head_dim) {
  return std::find(kFusedHeadDims.begin(), kFusedHeadDims.end(), head_dim) != kFusedHeadDims.end();
}
constexpr bool flash_sm90_head_dim(int head_dim) {
  return std::find(kFlashSm90HeadDims.begin(), kFlashSm90HeadDims.end(), head_dim) != kFlashSm90HeadDims.end();
}
constexpr bool fused_bwd_head_dim_built(int head_dim) {
  return std::find(kFusedBwdHeadDims.begin(), kFusedBwdHeadDims.end(), head_dim) != kFusedBwdHeadDims.end();
}
static_assert(std::all_of(kFlashSm90HeadDims.begin(), kFlashSm90HeadDims.end(), fused_head_dim_built),
              "flash's sm90 head dims are dispatched through kFusedHeadDims");

enum class FusedMask : int { None = 0, Causal = 1, CausalBottomRight = 2, SlidingWindow = 3 };

struct FusedParams {
  const void* q = nullptr;  // [B, H, Sq, D], head_dim contiguous
  const void* k = nullptr;  // [B, Hkv, Sk, D]
  const void* v = nullptr;  // [B, Hkv, Sk, D]
  void* o = nullptr;        // [B, H, Sq, D]
  // [B, H, Sq] float, contiguous: each query row's log-sum-exp (natural log) of
  // its scaled scores, +inf for a fully masked row. Written only when not null.
  float* lse = nullptr;
  // Element strides of batch, head and row; head_dim has stride 1.
  std::int64_t q_batch_stride = 0, q_head_stride = 0, q_row_stride = 0;
  std::int64_t k_batch_stride = 0, k_head_stride = 0, k_row_stride = 0;
  std::int64_t v_batch_stride = 0, v_head_stride = 0, v_row_stride = 0;
  std::int64_t o_batch_stride = 0, o_head_stride = 0, o_row_stride = 0;
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  float scale = 0.f;  // softmax scale
  FusedMask mask = FusedMask::None;
  int window = 0;    // SlidingWindow: keys j with i + (Sk - Sq) - window < j <= i + (Sk - Sq)
  bool bf16 = true;  // false: fp16
};

// Arguments of the fused backward (kernels/flash_bwd_sm80.cuh): the forward's
// problem and tensors (fwd.o is the forward's output O, fwd.lse its saved
// log-sum-exp, both read), the upstream gradient dO, the gradients and the
// FP32 workspace.
struct FusedBwdParams {
  FusedParams fwd;
  const void* dout = nullptr;  // [B, H, Sq, D], head_dim contiguous
  std::int64_t do_batch_stride = 0, do_head_stride = 0, do_row_stride = 0;
  void* dq = nullptr;  // [B, H, Sq, D]
  void* dk = nullptr;  // [B, Hkv, Sk, D]
  void* dv = nullptr;  // [B, Hkv, Sk, D]
  std::int64_t dq_batch_stride = 0, dq_head_stride = 0, dq_row_stride = 0;
  std::int64_t dk_batch_stride = 0, dk_head_stride = 0, dk_row_stride = 0;
  std::int64_t dv_batch_stride = 0, dv_head_stride = 0, dv_row_stride = 0;
  // Workspace: D = rowsum(dO * O), FP32 [B, H, Sq] contiguous; and, unless
  // deterministic, the FP32 dQ accumulator [B, H, Sq, D] contiguous.
  float* dsum = nullptr;
  float* dq_accum = nullptr;
  // dQ without atomics: a second kernel per query tile loops over the key
  // tiles in a fixed order (dq_accum unused).
  bool deterministic = false;
};

}  // namespace attnprof::cuda
