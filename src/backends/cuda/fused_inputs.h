// The fused kernels' arguments from a problem and a call's tensors (for
// efficient and flash: FusedBackend, fused_backend.h): the shape the kernels
// are asked for (FusedShape, FusedParams without addresses), then the
// tensors' addresses and strides, and a batch's sequences (packed lengths,
// padded rows, a paged cache's key counts) as the caller's own device
// tensors, checked in dtype, device and shape, never read on the host.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attnprof/backend.h"
#include "attnprof/batch_layout.h"
#include "attnprof/problem.h"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof::cuda {

// What the kernels are asked for `p` in layout `l` (fused_kernels.h's
// FusedShape): the problem's sizes and options, and which index tensors its
// runs give.
FusedShape fused_shape_for(const Problem& p, const BatchLayout& l);

// The kernels' arguments for a problem's shape (no tensors): what the plans
// (decode splits, workspace, expectations) are made from.
FusedParams fused_params_for(const Problem& p);

// The saved log-sum-exp's shape: [B, H, S, 1], or a packed batch's [1, H, total_q, 1].
Dims fused_lse_dims(const Problem& p);

// The tensors of a forward into f (checking their head_dim is contiguous;
// `backend` names the refusal): K and V from their pages with a paged cache
// (the logical K and V, which a caller's cache does not have, are not read).
void bind_forward_tensors(FusedParams& f, std::string_view backend, const Inputs& in, const Tensor& out, float* lse,
                          bool paged = false);

// Sequences of their own lengths into f (flash; fused_unsupported_reason
// refuses them elsewhere): a packed batch's cumulative lengths (the caller's
// own device tensors when Problem::lengths_on_device, read by the kernels
// only, which clamp them and flag what they clamp in the input-error word;
// else kept on the device per set of host lengths) with its tensors' batch
// strides 0; a dense batch's rows (Inputs::q_rows, kv_rows) as the caller's
// own device tensors, read by the kernels only, in stream order (which clamp
// them into the tensors): here their dtype, device and shape are checked,
// never their values (the checking mode reads them in stream order).
void bind_sequences(FusedParams& f, std::string_view backend, const Problem& p, const Inputs& in, RunContext& ctx);

// A tensor's batch, head and row strides.
void set_strides(const Tensor& t, std::int64_t& b, std::int64_t& h, std::int64_t& r);
// A contiguous [batch, heads, rows, dim] buffer's strides.
void set_contiguous(std::int64_t& b, std::int64_t& h, std::int64_t& r, std::int64_t heads, std::int64_t rows,
                    std::int64_t dim);

// p.shape_key() for a call's RecordFunction, built again only when the shape
// changes: four numbers formatted and joined (past 15 characters, a heap
// allocation) on every call otherwise. Keyed by the fields shape_key reads;
// per thread, and read by RecordFunction before this thread's next call.
const std::string& shape_key_of(const Problem& p);

}  // namespace attnprof::cuda
