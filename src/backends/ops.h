// The op interface the composite backends (naive, naive_inplace, math) are
// written in, once for every device, as PyTorch's math path is written over
// ATen ops. One implementation per device (cpu/ops.cpp over OpenBLAS,
// cuda/ops/ops_object.cpp over cuBLAS and our kernels) and a shape-only recording
// one (composite/plan.h) from which each backend's expectation derives.
//
// Conventions every implementation keeps:
//  - each op opens a profiler range named like PyTorch's op (kOps below) and
//    allocates from ctx.allocator; a name ending in '_' works in place, every
//    other op returns a fresh contiguous tensor;
//  - tensors are 4-d [B, H, rows, cols]; a second operand broadcasts (size-1
//    or stride-0 dims) to the first's shape;
//  - Boolean masks say keep: true = attend, as PyTorch's SDPA boolean mask.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof {

// What one call of an op issues per forward on a device, for the expectations.
struct OpCost {
  int activities = 0;  // kernels + memcpys + memsets on the device (none on the CPU)
  int copies = 0;      // device memcpys (CUDA) or copy_ ops (CPU)
};

struct OpSpec {
  std::string_view name;  // the profiler range: PyTorch's op name
  OpCost cpu, cuda;
  constexpr OpCost on(Device d) const { return d == Device::Cpu ? cpu : cuda; }
};

// Every op, with what it issues on each device. What is not predicted:
// cuBLAS (like cuDNN) may zero a workspace with a memset inside matmul on
// Hopper; the report names such memsets, and the GPU tests hold expectations
// to kernels and copies. It may also run a deep product split-K with a
// reduction kernel after it (the backward's dK and dV, of depth G*S), which
// the GPU tests set aside by name. matmul on the GPU also adds a "contiguous" kernel
// for an operand cuBLAS cannot read, and a "to" kernel for an output whose
// head dim is strided; the layouts the runner makes need neither, except the
// backward's matmul_tn of grouped heads over Q in a [B, S, H, D] layout
// (--bshd), whose group cannot be read as one matrix.
namespace op {
inline constexpr OpSpec matmul{"matmul", {}, {1, 0}};
inline constexpr OpSpec mul{"mul", {}, {1, 0}};
// Out of place: the hidden copy ("copy_", a device-to-device memcpy on the
// GPU, a copy op on the CPU), then the fill on the copy.
inline constexpr OpSpec masked_fill{"masked_fill", {0, 1}, {2, 1}};
inline constexpr OpSpec masked_fill_{"masked_fill_", {}, {1, 0}};
inline constexpr OpSpec add{"add", {}, {1, 0}};
inline constexpr OpSpec add_{"add_", {}, {1, 0}};
inline constexpr OpSpec softmax{"softmax", {}, {1, 0}};
// PyTorch's decomposition: softmax, eq(-inf), all(dim=-1), where.
inline constexpr OpSpec safe_softmax{"_safe_softmax", {}, {4, 0}};
inline constexpr OpSpec to{"to", {}, {1, 0}};
inline constexpr OpSpec ones{"ones", {}, {1, 0}};
inline constexpr OpSpec tril{"tril", {}, {1, 0}};
inline constexpr OpSpec triu{"triu", {}, {1, 0}};
inline constexpr OpSpec where{"where", {}, {1, 0}};
// The structural mask, built in one pass under a "tril" range; naive caches
// it per problem (a registered buffer), so it is not per-forward work.
inline constexpr OpSpec structural_mask{"tril", {}, {1, 0}};
// The backward's own: the softmax's backward (dS = P * (dP - rowsum(dP * P))),
// one pass on either device. Its products are "matmul", as the forward's.
inline constexpr OpSpec softmax_backward{"_softmax_backward_data", {}, {1, 0}};
// A paged KV cache read into a contiguous K or V (pages[block_table] then
// the reshape, as PyTorch's paged decode gathers it): one gather pass.
inline constexpr OpSpec gather_pages{"index_select", {}, {1, 0}};
// Soft-capping as Gemma-2's modelling code writes it, s / c, tanh, * c (the
// divide a mul by 1 / c); autograd keeps tanh's output, and its backward is
// grad * (1 - t^2), one pass (the two muls' backwards, * c then / c, cancel
// and are left out).
inline constexpr OpSpec tanh{"tanh", {}, {1, 0}};
inline constexpr OpSpec tanh_backward{"tanh_backward", {}, {1, 0}};
// FP8 inputs widened for the FP32 computation: e4m3 times the tensor's
// descale into FP32 in one pass (what x.to(torch.float32) * descale makes in
// two; aten's name for the quantized-to-float conversion).
inline constexpr OpSpec dequantize{"dequantize", {}, {1, 0}};
}  // namespace op

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  // The matrix products' story for eligibility reasons ("cuBLAS GEMMs in bf16
  // on tensor cores"), for operands of `operands`.
  virtual std::string describe_gemm(DType operands) const = 0;
  // Bytes the implementation holds beyond the tensors the ops return (the
  // cuBLAS workspace), for workspace_bytes().
  virtual std::size_t library_workspace_bytes() const = 0;

  // q @ k^T: q [B, H, S, D], k [B, Hkv, Skv, D] (H a multiple of Hkv, grouped
  // heads share K) -> [B, H, S, Skv] in q's dtype.
  virtual Tensor matmul_qk(const Tensor& q, const Tensor& k, RunContext& ctx) = 0;
  // p @ v into out ([B, H, S, D], any strides, p's dtype), or into a fresh
  // contiguous tensor of p's dtype.
  virtual void matmul_pv(const Tensor& p, const Tensor& v, Tensor& out, RunContext& ctx) = 0;
  virtual Tensor matmul_pv(const Tensor& p, const Tensor& v, RunContext& ctx) = 0;
  // a^T @ b over the rows, summed over the query heads of each grouped-query
  // group: a [B, H, S, M], b [B, H, S, N] -> out [B, Hkv, M, N] (H a multiple of
  // Hkv = out's heads; any strides with a contiguous last dim, a's dtype).
  // dV = P^T dO and dK = dS^T Q of the backward, one GEMM per group.
  virtual void matmul_tn(const Tensor& a, const Tensor& b, Tensor& out, RunContext& ctx) = 0;

  virtual Tensor mul(const Tensor& x, float s, RunContext& ctx) = 0;
  // x.masked_fill(~keep, value): the hidden copy, then the fill on it.
  virtual Tensor masked_fill(const Tensor& x, const Tensor& keep, float value, RunContext& ctx) = 0;
  virtual void masked_fill_(Tensor& x, const Tensor& keep, float value, RunContext& ctx) = 0;
  // a + b in a's dtype; b may have another floating dtype.
  virtual Tensor add(const Tensor& a, const Tensor& b, RunContext& ctx) = 0;
  virtual void add_(Tensor& a, const Tensor& b, RunContext& ctx) = 0;

  // Row softmax over the last dim. Plain: a row of only -inf becomes NaN, as
  // torch.softmax makes it. Safe: such a row becomes zeros (_safe_softmax).
  virtual Tensor softmax(const Tensor& x, RunContext& ctx) = 0;
  virtual Tensor safe_softmax(const Tensor& x, RunContext& ctx) = 0;
  // The backward of either: grad * probs - probs * rowsum(grad * probs), in
  // grad's dtype (probs may have another). A zero row of probs (a fully
  // masked row of _safe_softmax) gives a zero row; a NaN one stays NaN.
  virtual Tensor softmax_backward(const Tensor& grad, const Tensor& probs, RunContext& ctx) = 0;

  // An e4m3 tensor's real values, x * descale, into a fresh contiguous FP32
  // tensor (x any strides).
  virtual Tensor dequantize(const Tensor& x, float descale, RunContext& ctx) = 0;
  // dtype conversion into a fresh tensor, or into dst (same shape, any strides).
  virtual Tensor to(const Tensor& x, DType dtype, RunContext& ctx) = 0;
  virtual void to_into(const Tensor& src, Tensor& dst, RunContext& ctx) = 0;

  // Mask builders. ones: bool ones. tril / triu: keep x[.., i, j] where
  // j - i <= diagonal / >= diagonal, zero elsewhere. where: cond ? if_true :
  // if_false as FP32, broadcast dims of cond kept size 1 in the result.
  virtual Tensor ones(const Dims& sizes, RunContext& ctx) = 0;
  virtual Tensor tril(const Tensor& x, std::int64_t diagonal, RunContext& ctx) = 0;
  virtual Tensor triu(const Tensor& x, std::int64_t diagonal, RunContext& ctx) = 0;
  virtual Tensor where(const Tensor& cond, float if_true, float if_false, RunContext& ctx) = 0;
  // p's structural mask (causal, bottom-right causal, sliding window; None
  // keeps every key) as bool [1, 1, S, Skv], true = attend, Problem::visible().
  virtual Tensor structural_mask(const Problem& p, RunContext& ctx) = 0;

  // A paged cache's K or V gathered into a fresh contiguous [B, Hkv, kv_seq, D]:
  // pages [num_pages, Hkv, page_size, D], block_table int32 [1, 1, B, pages_per_seq]
  // (Inputs), key j of sequence b read from page block_table[b][j / page_size]
  // at row j % page_size. Devices without it refuse (the default here).
  virtual Tensor gather_pages(const Tensor& pages, const Tensor& block_table, std::int64_t kv_seq, RunContext& ctx);

  // Soft-capping's pieces: tanh(x) into a fresh tensor of x's dtype, and its
  // backward grad * (1 - t^2) from tanh's output t, in grad's dtype. Devices
  // without them refuse (the default here; eligibility refuses a soft cap
  // there first).
  virtual Tensor tanh(const Tensor& x, RunContext& ctx);
  virtual Tensor tanh_backward(const Tensor& grad, const Tensor& t, RunContext& ctx);
};

}  // namespace attnprof
