// Host-side arguments of the fused attention kernels (efficient, flash).
// Plain data so that kernels depend on nothing above them.
#pragma once

#include <cstdint>

namespace attnprof::cuda {

enum class FusedMask : int { None = 0, Causal = 1, CausalBottomRight = 2, SlidingWindow = 3 };

struct FusedParams {
  const void* q = nullptr;  // [B, H, Sq, D], head_dim contiguous
  const void* k = nullptr;  // [B, Hkv, Sk, D]
  const void* v = nullptr;  // [B, Hkv, Sk, D]
  void* o = nullptr;        // [B, H, Sq, D]
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
