// The attention mask, one enum from the problem (problem.h) down to the fused
// kernels (backends/cuda/fused_params.h, whose kernels map it once to their
// template parameter: kernels/fwd_args.cuh). No dependencies, so that a
// kernel header can include it; its names and parsing are in problem.h.
#pragma once

#include <cstdint>

namespace attnprof {

enum class MaskKind : std::uint8_t {
  None,
  Causal,             // top-left aligned: query i sees keys j <= i (PyTorch's is_causal)
  CausalBottomRight,  // query i sees keys j <= i + (kv_seq - seq) (FlashAttention's)
  SlidingWindow,      // bottom-right causal, and only the last `window` keys: i + off - window < j <= i + off
  Boolean,            // a [batch|1, heads|1, seq, kv_seq] boolean tensor, true = attend
  Bias,               // a [batch|1, heads|1, seq, kv_seq] additive bias
};

}  // namespace attnprof
