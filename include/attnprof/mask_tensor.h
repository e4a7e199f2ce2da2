// A caller's mask tensor, as PyTorch's scaled_dot_product_attention takes it:
// boolean (true attends) or an additive float bias, broadcastable to
// [B, H, S, Skv]. One path for every front end: the CLI's --mask-file and
// Python's attn_mask= both end in attach_mask(), which puts the tensor (its
// broadcast dimensions as stride-0 views, nothing copied) into the Inputs
// slot the backends already read for the generated boolean and bias masks.
#pragma once

#include <string>
#include <string_view>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof {

// The mask kind a tensor of this dtype is: Bool -> Boolean, a float -> Bias.
// Throws Error(InvalidArgument) naming `name` for anything else.
MaskKind mask_kind_of(std::string_view name, DType dtype);

// `mask` checked against p (p.mask already mask_kind_of its dtype; its sizes
// right-aligned and padded with leading 1s to 4-d by the caller) and
// broadcast to [B, H, S, Skv]: each dimension p's or 1; a Bias in p's dtype
// (as SDPA wants a float mask in the query's dtype; bf16 for fp8 inputs); on `where` (the device
// of the tensors it goes with: the caller's q, or the host inputs that the
// runner uploads). One-line Error(InvalidArgument) naming `name` otherwise.
Tensor broadcast_mask(const Problem& p, const Tensor& mask, std::string_view name, Device where);

// in.mask (Boolean) or in.bias (Bias) = broadcast_mask(p, mask, name), on
// in.q's device (p's when in.q is not set yet).
void attach_mask(const Problem& p, const Tensor& mask, Inputs& in, std::string_view name);

// A .npy file (NumPy's format, versions 1 to 3) holding a boolean or float
// (float16, float32, float64) array of 1 to 4 dimensions, C order, read onto
// the CPU: Bool, or F32 for any float (converted later to the problem's dtype
// by convert_mask()). Sizes are right-aligned to 4-d with leading 1s. A file
// that is not such an array (bad magic, a header that does not parse, another
// dtype, Fortran order, a size the data does not hold, more than 2^31
// elements) is refused with Error(BadInput) in one line naming the file.
Tensor read_mask_file(const std::string& path);

// A CPU mask in the dtype p wants: Bool unchanged; a float copied into p's
// output dtype (p's dtype; bf16 for fp8) (contiguous, the file's own shape).
Tensor convert_mask(const Problem& p, const Tensor& mask);

}  // namespace attnprof
