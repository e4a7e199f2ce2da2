// The composite backends: attention written once over the op interface
// (backends/ops.h), as PyTorch's math path is written over ATen ops, and run on
// whichever device the Ops object handed in belongs to. Their expectations
// derive from the ops their forward calls (plan.h), so the CPU and the GPU
// cannot drift apart.
#pragma once

#include <memory>

#include "attnprof/backend.h"
#include "backends/ops.h"

namespace attnprof::composite {

// The textbook decomposition over materialised [S, Skv] scores: matmul, mul,
// the mask (masked_fill out of place, with its hidden copy), softmax, matmul.
std::unique_ptr<Backend> make_naive(std::unique_ptr<Ops> ops);  // naive.cpp
// The same with masked_fill_ (and add_ for a bias): no copy.
std::unique_ptr<Backend> make_naive_inplace(std::unique_ptr<Ops> ops);  // naive.cpp
// PyTorch's _scaled_dot_product_attention_math, op for op.
std::unique_ptr<Backend> make_math(std::unique_ptr<Ops> ops);  // math.cpp

}  // namespace attnprof::composite
