// The output of an FP8 forward that cuDNN writes in e4m3 (its FP8 SDPA graph
// takes a bf16 O only on Blackwell): O's e4m3 values times its descale,
// written into the problem's bf16 output on the device. One memory-bound
// kernel (fp8_output.cu), the cudnn backend's second own kernel beside
// mask_to_bias.cu.
#pragma once

#include "attnprof/tensor.h"

namespace attnprof::cuda {

// out = in x descale, rounded to nearest even: `in` a contiguous e4m3 CUDA
// tensor, `out` a bf16 CUDA tensor of the same sizes and any strides.
// Launched on `stream` (a cudaStream_t). Throws Error(Internal) for other
// dtypes or sizes.
void e4m3_to_bf16(const Tensor& in, float descale, Tensor& out, void* stream);

}  // namespace attnprof::cuda
