// The CPU ops that naive, naive_inplace and math are written in. Each op is
// one separate pass over its tensors and opens a profiler range named like
// PyTorch's op, so the CPU lane reads matmul, mul, masked_fill, softmax ...
// All tensors here are [B, H, rows, cols]; new tensors come from the allocator.
#pragma once

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof::cpu {

// scores[b, h] = q[b, h] @ k[b, h / group]^T through OpenBLAS sgemm. The result
// has dtype `out`: 16-bit operands are widened to FP32 per head, multiplied in
// FP32 and the product rounded to `out`.
Tensor matmul_qk(const Tensor& q, const Tensor& k, DType out, Allocator& a);
// out[b, h] = p[b, h] @ v[b, h / group] (written into an existing tensor).
void matmul_pv(const Tensor& p, const Tensor& v, Tensor& out);

Tensor mul(const Tensor& x, float s, Allocator& a);
// Out of place: allocates, copies ("copy_"), then fills where masked is true.
Tensor masked_fill(const Tensor& x, const Tensor& masked, float value, Allocator& a);
void masked_fill_(Tensor& x, const Tensor& masked, float value);
Tensor add(const Tensor& x, const Tensor& y, Allocator& a);
void add_(Tensor& x, const Tensor& y);
Tensor softmax(const Tensor& x, Allocator& a);       // a fully masked row gives NaN, as plain softmax does
Tensor safe_softmax(const Tensor& x, Allocator& a);  // a fully masked row gives zeros
Tensor to(const Tensor& x, DType t, Allocator& a);   // dtype conversion (a copy)
void to_into(const Tensor& x, Tensor& out);          // the same conversion into an existing tensor
Tensor logical_not(const Tensor& m, Allocator& a);

// Mask construction as PyTorch's math path does it: ones -> tril -> where.
Tensor ones_bool(std::int64_t rows, std::int64_t cols, Allocator& a);
// Keeps (i, j) where the problem's structural mask makes j visible from i.
void tril_(Tensor& m, const Problem& p);
// 0 where keep is true, -inf elsewhere (FP32), the additive form of a mask.
Tensor where_additive(const Tensor& keep, Allocator& a);

// The boolean "masked" tensor (true = hide) of a structural mask, [1, 1, S, Skv]
// expanded to [B, H, S, Skv]; built without profiler ranges (naive caches it).
Tensor structural_masked(const Problem& p, Allocator& a);

std::string dims_string(const Tensor& t);
std::string dtypes_string(std::initializer_list<const Tensor*> ts);

}  // namespace attnprof::cpu
