// Whether two tensors share memory, and the forward's check that its output
// shares none with its inputs.
#pragma once

#include <string_view>

#include "attnprof/backend.h"
#include "attnprof/tensor.h"

namespace attnprof {

// Whether a and b share a byte of memory (views of one buffer, in any strides:
// interleaved views that share none do not overlap). Tensors on different
// devices, undefined or empty ones never do.
bool overlaps(const Tensor& a, const Tensor& b);

// Throws Error(InvalidArgument), one line naming the input, where `out`
// shares memory with any tensor of `in` (q, k, v, the mask, the bias, the
// pages, the block table, the key counts): a forward reads its inputs block by
// block while it writes out, so an output over an input gives wrong numbers
// (issue 49: flash with out=V). Every backend's forward calls it before any work.
void require_output_apart(const Inputs& in, const Tensor& out, std::string_view backend);

}  // namespace attnprof
