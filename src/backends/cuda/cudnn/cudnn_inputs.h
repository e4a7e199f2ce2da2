// What a cudnn call binds beyond its Q, K, V and O (cudnn.cpp's run()): a
// boolean mask lowered to what cuDNN reads (the padding mask's per-sequence
// lengths, or an additive bias made on the device), and a packed batch's
// ragged offsets and lengths. The int32 offsets and lengths are kept on the
// device by value (a problem's data, the same on every call of a problem),
// so a repeated call binds the same buffers and finds its cached variant
// pack. Only cudnn.cpp includes it, in builds with the cuDNN frontend.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "backends/cuda/cudnn/cudnn_graph.h"
#include "backends/cuda/sequence_lengths.h"

namespace attnprof::cuda::cudnn_graph {

class CallInputs {
 public:
  // A boolean mask as the graph reads it, on the problem (a copy with mask
  // bias) and the bound tensors: the additive bias it is turned into on the
  // device (0 where true, -inf where false, in q's dtype: mask_to_bias.cu),
  // in the call's stream order; the mask is never read on the host (a
  // right-padded key-padding mask used to be read back to run as cuDNN's
  // padding mask: a wait per call, out of the caller's stream order).
  //
  // A fully masked row (a row of the mask all false) is every key at -inf.
  // The float64 reference gives such a row zeros (and zero gradients); cuDNN
  // gives its row what its kernel's guard for an empty row gives, so
  // tests/gpu/cudnn_ragged_test.cpp holds it to the reference.
  Problem lower_mask(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx);

  // A packed batch's ragged offsets (each bound packed tensor's sequence
  // starts: cu_seqlens times its row stride, in elements) and the padding
  // mask's lengths. Each packed tensor is checked to hold the batch's rows:
  // [1, heads, total, D]. Lengths on the host (Problem::seq_lens): bound from
  // ints(). Lengths on the device (Problem::lengths_on_device, the caller's
  // Inputs::cu_seqlens_q and _k): made by one small kernel on ctx.stream
  // (ops/ragged_offsets.h), clamped there as flash clamps them, into a
  // buffer kept per stream (calls on one stream are ordered, so a later
  // call's kernel never overwrites what an earlier graph still reads; the
  // same addresses keep the cached variant pack): nothing is read on the host.
  void bind_ragged(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx);

  // Past kMaxInts buffers the offsets and lengths of earlier calls go (a
  // call adds at most 11): true when they went, and no cached call may point
  // at them any more.
  bool trim();

 private:
  void bind_device_ragged(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx);
  // `values` as int32 [n, 1, 1, 1] on the device, made from the call's
  // allocator the first time these values are asked for and kept.
  const Tensor& ints(const std::vector<std::int32_t>& values, RunContext& ctx);

  // The device offsets and lengths by their values (sequence_lengths.h says
  // how their lifetime differs from flash's); started over past kMaxInts
  // buffers.
  static constexpr std::size_t kMaxInts = 256;
  KeptInts ints_;
  // A boolean mask's bias (lower_mask()), kept so that calls bind one address.
  Tensor mask_bias_;
  // Device-made offsets and lengths (bind_ragged()), one buffer per stream,
  // with the [n, 1, 1, 1] views bound from it.
  struct DeviceRagged {
    Tensor buffer;
    std::array<Tensor, kRagged.size() + 2> views;
  };
  std::map<void*, DeviceRagged> device_ragged_;
};

}  // namespace attnprof::cuda::cudnn_graph
