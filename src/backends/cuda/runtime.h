// Helpers of the CUDA device runtime that other CUDA code may share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attnprof/dtype.h"
#include "attnprof/tensor.h"

namespace attnprof::cuda {

// Fills n elements (fp32, fp16 or bf16) with values uniform in [-1, 1) from a
// counter-based hash of (seed, index): reproducible, no state, one kernel.
// Used for the ceiling GEMM's operands, which must not be zeros (a product of
// zeros runs faster than real data on some parts).
void fill_uniform(void* data, std::int64_t n, DType dtype, std::uint64_t seed, cudaStream_t stream);

// A host copy of a CUDA tensor, read on `stream` and waited for: the same
// sizes and strides over a copy of exactly the elements the view touches (an
// expanded mask's broadcast dimensions are not materialised). A host tensor
// is returned as it is.
Tensor download_on(const Tensor& t, cudaStream_t stream);

}  // namespace attnprof::cuda
