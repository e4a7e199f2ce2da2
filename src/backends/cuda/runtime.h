// Helpers of the CUDA device runtime that other CUDA code may share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attnprof/dtype.h"

namespace attnprof::cuda {

// Fills n elements (fp32, fp16 or bf16) with values uniform in [-1, 1) from a
// counter-based hash of (seed, index): reproducible, no state, one kernel.
// Used for the ceiling GEMM's operands, which must not be zeros (a product of
// zeros runs faster than real data on some parts).
void fill_uniform(void* data, std::int64_t n, DType dtype, std::uint64_t seed, cudaStream_t stream);

}  // namespace attnprof::cuda
