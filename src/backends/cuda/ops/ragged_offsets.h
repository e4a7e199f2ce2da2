// cuDNN's ragged offsets and padding-mask lengths of a packed batch, made on
// the device from the caller's cumulative lengths (issue 56 item 2): no host
// read, in the caller's stream order. One small kernel (ragged_offsets.cu),
// the cudnn backend's third own kernel beside mask_to_bias.cu and
// fp8_output.cu.
#pragma once

#include <cstdint>

namespace attnprof::cuda {

inline constexpr int kMaxRaggedTensors = 9;  // cudnn_graph.h's kRagged

struct RaggedOffsetsArgs {
  const std::int32_t* cu_q = nullptr;  // the caller's int32 [batch + 1] each, read here only
  const std::int32_t* cu_k = nullptr;
  int batch = 0;
  int total_q = 0, total_k = 0;                     // the packed rows: every sequence is clamped into them
  int max_q = 0, max_k = 0;                         // the longest sequence the graph was built for
  int count = 0;                                    // packed tensors bound (at most kMaxRaggedTensors)
  std::int64_t row_stride[kMaxRaggedTensors] = {};  // each tensor's row stride, in elements
  bool query[kMaxRaggedTensors] = {};               // rows of the queries (else of the keys)
  // count x (batch + 1) offsets (sequence b's first element of tensor i), then
  // the query lengths [batch] and the key lengths [batch].
  std::int32_t* out = nullptr;
  // Set to kInputBadCuSeqlens (fused_params.h) where an entry was clamped, or null.
  unsigned* input_errors = nullptr;
};

// Sequence b's rows are cu[b] .. cu[b + 1] - 1 clamped as flash's kernels
// clamp them (geometry::packed_rows): into the packed rows, at most the
// maximum long, so that cuDNN reads and writes nothing outside the tensors
// whatever the lengths hold. Launched on `stream`.
void ragged_offsets(const RaggedOffsetsArgs& a, void* stream);

}  // namespace attnprof::cuda
