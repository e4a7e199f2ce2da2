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

constexpr bool fused_head_dim_built(int head_dim) {
  return std::find(kFusedHeadDims.begin(), kFusedHeadDims.end(), head_dim) != kFusedHeadDims.end();
}
constexpr bool flash_sm90_head_dim(int head_dim) {
  return std::find(kFlashSm90HeadDims.begin(), kFlashSm90HeadDims.end(), head_dim) != kFlashSm90HeadDims.end();
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

}  // namespace attnprof::cuda
