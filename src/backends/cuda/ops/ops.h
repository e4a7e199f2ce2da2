// The CUDA ops the composite backends (naive, naive_inplace, math) run on: the
// launch wrappers behind the Ops object (ops_object.cpp, backends/ops.h).
//
// Each op opens a RecordFunction named after the PyTorch op it stands for (the
// names and per-op device activities are backends/ops.h's table), so the CPU
// lane of our trace reads like the reference study's, and launches on
// ctx.stream. Every result comes from ctx.allocator, so memory is tracked, and
// every result is a fresh contiguous tensor unless the name ends in '_'
// (in place), as in PyTorch.
#pragma once

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "backends/ops.h"

namespace attnprof::cuda::ops {

// A cuBLAS handle with a workspace from the tracked allocator. One per backend
// object: handles are not safe to share between threads binding other streams.
class Blas {
 public:
  Blas() = default;
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // The handle bound to ctx.stream. Created on first use; the workspace is set
  // again only when the stream changes, because cublasSetStream resets it.
  cublasHandle_t bind(RunContext& ctx);

 private:
  cublasHandle_t handle_ = nullptr;
  void* stream_ = nullptr;
  bool stream_set_ = false;
  Tensor workspace_;
};

// Bytes of the cuBLAS workspace a Blas holds (for workspace_bytes()).
std::size_t blas_workspace_bytes();

// --- matrix products (cuBLAS, batched over batch and heads) ---------------
// The precision follows the operands: 16-bit operands run on tensor cores with
// FP32 accumulation; FP32 operands run as plain SGEMM (TF32 off), which is what
// the math backend is meant to show.

// q @ k^T: q [B, H, S, D], k [B, Hkv, Skv, D] (H a multiple of Hkv: grouped
// heads share their K) -> [B, H, S, Skv] in q's dtype.
Tensor matmul_qk(Blas& blas, const Tensor& q, const Tensor& k, RunContext& ctx);
// p @ v into out: p [B, H, S, Skv] contiguous, v [B, Hkv, Skv, D], out
// [B, H, S, D] with any strides.
void matmul_pv(Blas& blas, const Tensor& p, const Tensor& v, Tensor& out, RunContext& ctx);
// p @ v into a fresh contiguous [B, H, S, D] tensor of p's dtype.
Tensor matmul_pv(Blas& blas, const Tensor& p, const Tensor& v, RunContext& ctx);
// a^T @ b into out, summed over the query heads of each group: a [B, H, S, M],
// b [B, H, S, N], out [B, Hkv, M, N] with any strides. The backward's dV and
// dK: a group's heads, stacked as rows, are one GEMM of depth G*S.
void matmul_tn(Blas& blas, const Tensor& a, const Tensor& b, Tensor& out, RunContext& ctx);

// --- elementwise -----------------------------------------------------------

// x * s, out of place ("mul").
Tensor mul(const Tensor& x, float s, RunContext& ctx);
// Soft-capping's pieces (Ops::tanh, Ops::tanh_backward), out of place on
// contiguous tensors: tanh(x) ("tanh"), and grad * (1 - t^2) from tanh's
// output t of grad's sizes and dtype ("tanh_backward"), each one kernel.
Tensor tanh(const Tensor& x, RunContext& ctx);
Tensor tanh_backward(const Tensor& grad, const Tensor& t, RunContext& ctx);
// Out of place ("masked_fill"): a device-to-device copy of x ("copy_"), then the
// fill on the copy ("masked_fill_"). The copy is the hidden one the reference
// trace showed. `keep` is a bool tensor broadcastable to x, true = attend; the
// fill writes `value` where keep is false (masked_fill(~keep, value)).
Tensor masked_fill(const Tensor& x, const Tensor& keep, float value, RunContext& ctx);
void masked_fill_(Tensor& x, const Tensor& keep, float value, RunContext& ctx);
// a + b with b broadcast to a's shape; the result has a's dtype.
Tensor add(const Tensor& a, const Tensor& b, RunContext& ctx);
void add_(Tensor& a, const Tensor& b, RunContext& ctx);
// A contiguous copy converted to `dtype` ("to"); strided sources allowed.
Tensor to(const Tensor& x, DType dtype, RunContext& ctx);
// Converts src into dst of the same shape, any strides on both ("to" + "copy_"
// in PyTorch; one kernel here).
void to_into(const Tensor& src, Tensor& dst, RunContext& ctx);
// An e4m3 tensor's real values, x * descale, into a fresh contiguous FP32
// tensor ("dequantize", one kernel); x any strides.
Tensor dequantize(const Tensor& x, float descale, RunContext& ctx);
// A contiguous copy of a strided tensor in the same dtype ("contiguous").
Tensor contiguous(const Tensor& x, RunContext& ctx);

// --- mask builders ---------------------------------------------------------

// bool ones of the given shape ("ones").
Tensor ones(const Dims& sizes, RunContext& ctx);
// Lower / upper triangle of the last two dims, out of place ("tril" / "triu"):
// keeps x[.., i, j] where j - i <= diagonal (tril) or j - i >= diagonal (triu).
Tensor tril(const Tensor& x, std::int64_t diagonal, RunContext& ctx);
Tensor triu(const Tensor& x, std::int64_t diagonal, RunContext& ctx);
// cond ? if_true : if_false as an FP32 tensor of cond's shape ("where"): turns
// a boolean mask into an additive one.
Tensor where(const Tensor& cond, float if_true, float if_false, RunContext& ctx);
// The structural mask of p (causal, bottom-right causal, sliding window) as
// bool [1, 1, S, Skv], true = attend, in one kernel; Problem::visible() rules.
Tensor structural_mask(const Problem& p, RunContext& ctx);

// --- paged KV cache -----------------------------------------------------------

// A paged cache's K or V gathered into a fresh contiguous [B, Hkv, kv_seq, D]
// ("index_select", one kernel): pages [num_pages, Hkv, page_size, D]
// contiguous, block_table int32 [1, 1, B, pages_per_seq] (any strides), key j
// of sequence b read from page block_table[b][j / page_size] at row
// j % page_size. The table stays on the device, so its entries cannot be
// refused before the kernel reads them (that would cost a copy back and a
// wait per call): a row whose entry is no physical page is written as NaN
// rather than read from outside the cache, and the float64 check fails.
Tensor gather_pages(const Tensor& pages, const Tensor& block_table, std::int64_t kv_seq, RunContext& ctx);

// --- row softmax over the last dim --------------------------------------------

// Plain softmax, out of place: a row whose every entry is -inf becomes NaN, as
// torch.softmax makes it.
Tensor softmax(const Tensor& x, RunContext& ctx);
// PyTorch's _safe_softmax, in its own decomposition: softmax, eq(-inf),
// all(dim=-1), where(fully masked row, 0, softmax). A fully masked row becomes
// zeros; four kernels and two extra score-sized buffers.
Tensor safe_softmax(const Tensor& x, RunContext& ctx);
// The softmax's backward ("_softmax_backward_data"): probs * (grad -
// rowsum(grad * probs)) in grad's dtype, one kernel, one block per row.
Tensor softmax_backward(const Tensor& grad, const Tensor& probs, RunContext& ctx);

}  // namespace attnprof::cuda::ops
