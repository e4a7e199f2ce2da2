// The CPU implementation of the composite backends' ops (backends/ops.h):
// each op is one separate pass over its tensors, OpenMP over rows, OpenBLAS
// sgemm for the matrix products, so the CPU lane reads matmul, mul,
// masked_fill, softmax ... like PyTorch's. The ops object comes from
// cpu::make_ops() (cpu_backends.h); this header holds the range formatting the
// CPU ops and flash share.
#pragma once

#include <initializer_list>
#include <string>

#include "attnprof/tensor.h"

namespace attnprof::cpu {

// "[B, H, S, D]" and "bf16, bf16": the input dims and dtypes of a profiler range.
std::string dims_string(const Tensor& t);
std::string dims_string(const Dims& d);
std::string dtypes_string(std::initializer_list<const Tensor*> ts);

}  // namespace attnprof::cpu
