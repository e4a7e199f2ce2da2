// A boolean attention mask turned, on the device, into what cuDNN's SDPA
// reads instead: an additive bias in the problem's dtype (0 where true,
// -inf where false), or a compact bool copy to read back on the host. One
// grid-stride kernel (mask_to_bias.cu); the cudnn backend's only own kernel.
#pragma once

#include "attnprof/tensor.h"

namespace attnprof::cuda {

// The sizes of `mask` with its broadcast (stride-0) dimensions as 1: the
// shape of what mask_to_bias() writes.
Dims compact_sizes(const Tensor& mask);

// Writes the bool CUDA tensor `mask` ([B|1, H|1, S|1, Skv], any strides, 0 on
// broadcast dimensions) into `out`, a contiguous CUDA tensor of
// compact_sizes(mask), or of sizes the mask broadcasts to (a dimension of 1
// in compact_sizes(mask) repeated): for a BF16 or F16 `out`, 0 where the mask
// is true and -inf where false; for a Bool `out`, a compact copy. Launched on
// `stream` (a cudaStream_t). Throws Error(Internal) for another dtype or shape.
void mask_to_bias(const Tensor& mask, Tensor& out, void* stream);

}  // namespace attnprof::cuda
