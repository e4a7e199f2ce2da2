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
// The same with the descale descale x *descale_device, read by the kernel
// (a caller's device descale tensor; null: descale alone).
void e4m3_to_bf16(const Tensor& in, float descale, const float* descale_device, Tensor& out, void* stream);

// cuDNN's FP8 graph's input scalars (cudnn_fp8.h: descale q, k, v, s;
// scale s, o) written on the device, from the caller's descale tensors where
// given (device[i], q, k and v) and the host's numbers for the rest: no host
// read of a device descale. With o_headroom > 0, scale_o is 1 / (o_headroom
// x V's descale), computed there.
struct Fp8GraphScalars {
  const float* device[3];
  float host[6];
};
void fp8_graph_scalars(const Fp8GraphScalars& s, float* slots, int stride, float o_headroom, void* stream);

}  // namespace attnprof::cuda
