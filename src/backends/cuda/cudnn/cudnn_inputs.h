// What a cudnn call binds beyond its Q, K, V and O (cudnn.cpp's run()): a
// boolean mask lowered to what cuDNN reads (the padding mask's per-sequence
// lengths, or an additive bias made on the device), and a packed batch's
// ragged offsets and lengths. The int32 offsets and lengths are kept on the
// device by value (a problem's data, the same on every call of a problem),
// so a repeated call binds the same buffers and finds its cached variant
// pack. Only cudnn.cpp includes it, in builds with the cuDNN frontend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "backends/cuda/cudnn/cudnn_graph.h"
#include "backends/cuda/sequence_lengths.h"

namespace attnprof::cuda::cudnn_graph {

class CallInputs {
 public:
  // Whether cuDNN takes the graph of a problem and layout (the backend's
  // cache answers, building the graph on first sight).
  using Takes = std::function<bool(const Problem&, const Layout&)>;

  // A boolean mask as the graph reads it, on the problem (a copy with the
  // mask it runs as) and the bound tensors. The mask's compact form is read
  // back (a copy and a wait per call) and, when it is a key-padding mask
  // of right padding (core/mask_lowering.h), runs as the padding mask: each
  // sequence's key count, all S queries (mask none); otherwise (left padding
  // too) as the bias it is turned into
  // (mask bias). No soft cap beside the padding mask (the frontend takes no
  // score modifier with one), and the bias form whenever cuDNN refuses the
  // padding one (`takes`).
  //
  // A fully masked row (a sequence of key count 0, or a row of the mask all
  // false) is every key at -inf. The float64 reference gives such a row zeros
  // (and zero gradients); cuDNN gives its row what its kernel's guard for an
  // empty row gives (zeros from 9.25 on for a zero key count; before, NaN,
  // NVIDIA/cudnn-frontend#943), so tests/gpu/cudnn_ragged_test.cpp holds it
  // to the reference.
  Problem lower_mask(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx, const Takes& takes);

  // A packed batch's ragged offsets (each bound packed tensor's sequence
  // starts: cu_seqlens times its row stride, in elements) and the padding
  // mask's lengths, bound from ints(). Each packed tensor is checked to hold
  // the batch's rows: [1, heads, total, D].
  void bind_ragged(const Problem& p, Bound& t, RunContext& ctx);

  // Past kMaxInts buffers the offsets and lengths of earlier calls go (a
  // call adds at most 11): true when they went, and no cached call may point
  // at them any more.
  bool trim();

 private:
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
};

}  // namespace attnprof::cuda::cudnn_graph
