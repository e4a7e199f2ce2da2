// The mask builders of the unfused CUDA backends (ops.h): ones, tril, triu,
// where and the structural mask, one plain kernel each, as PyTorch builds a
// mask op by op (naive caches the structural one; math rebuilds is_causal's
// every call).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backends/cuda/ops/ops.h"
#include "backends/cuda/ops/ops_common.h"
#include "core/mask_geometry.h"

namespace attnprof::cuda::ops {
namespace {

using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::OpRange;
using detail::require_contiguous;
using detail::stream_of;

__global__ void fill_bool_kernel(std::uint8_t* x, std::int64_t n, std::uint8_t value) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < n;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    x[e] = value;
  }
}

// Keeps x[.., i, j] where j - i <= diagonal (upper = false) or >= (upper = true).
__global__ void triangle_kernel(const std::uint8_t* x, std::uint8_t* y, std::int64_t rows, std::int64_t cols,
                                std::int64_t n, std::int64_t diagonal, bool upper) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < n;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t j = e % cols, i = (e / cols) % rows;
    const bool in = upper ? (j - i >= diagonal) : (j - i <= diagonal);
    y[e] = in ? x[e] : std::uint8_t{0};
  }
}

// cond may be a broadcast view (stride 0); out is contiguous of sizes n.
__global__ void where_kernel(const std::uint8_t* cond, Dims cs, float* out, Dims n, std::int64_t total, float if_true,
                             float if_false) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    out[e] = cond[dev::Index4(e, n).at(cs)] ? if_true : if_false;
  }
}

// Key j is visible from query i when lo <= j - i <= hi (Problem::visible()).
__global__ void structural_mask_kernel(std::uint8_t* m, std::int64_t cols, std::int64_t n, std::int64_t lo,
                                       std::int64_t hi) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < n;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t d = e % cols - e / cols;
    m[e] = d >= lo && d <= hi;
  }
}

}  // namespace

Tensor ones(const Dims& sizes, RunContext& ctx) {
  OpRange range(op::ones.name, {});
  Tensor y = Tensor::empty(sizes, DType::Bool, ctx.allocator);
  fill_bool_kernel<<<grid_for(y.numel()), kThreads, 0, stream_of(ctx)>>>(y.data_as<std::uint8_t>(), y.numel(), 1);
  check_launch();
  return y;
}

namespace {

Tensor triangle(const char* name, const Tensor& x, std::int64_t diagonal, bool upper, RunContext& ctx) {
  OpRange range(name, {&x}, /*scalar=*/true);
  require_contiguous(x, name);
  if (x.dtype() != DType::Bool) fail(ErrorKind::Internal, std::string(name) + " here builds bool masks only");
  Tensor y = Tensor::empty(x.sizes(), DType::Bool, ctx.allocator);
  triangle_kernel<<<grid_for(x.numel()), kThreads, 0, stream_of(ctx)>>>(
      x.data_as<std::uint8_t>(), y.data_as<std::uint8_t>(), x.size(2), x.size(3), x.numel(), diagonal, upper);
  check_launch();
  return y;
}

}  // namespace

Tensor tril(const Tensor& x, std::int64_t diagonal, RunContext& ctx) {
  return triangle(op::tril.name.data(), x, diagonal, false, ctx);
}

Tensor triu(const Tensor& x, std::int64_t diagonal, RunContext& ctx) {
  return triangle(op::triu.name.data(), x, diagonal, true, ctx);
}

Tensor where(const Tensor& cond, float if_true, float if_false, RunContext& ctx) {
  OpRange range(op::where.name, {&cond}, /*scalar=*/true);
  detail::require_cuda(cond, "where");
  if (cond.dtype() != DType::Bool) fail(ErrorKind::Internal, "where needs a bool condition, got " + cond.describe());
  // Broadcast dims stay size 1 in the result: an expanded [S, Skv] mask gives
  // an [S, Skv] additive mask, not a [B, H, S, Skv] one.
  Dims sizes = cond.sizes();
  for (int d = 0; d < 4; ++d) {
    if (cond.stride(d) == 0) sizes[static_cast<std::size_t>(d)] = 1;
  }
  Tensor y = Tensor::empty(sizes, DType::F32, ctx.allocator);
  where_kernel<<<grid_for(y.numel()), kThreads, 0, stream_of(ctx)>>>(
      cond.data_as<std::uint8_t>(), cond.strides(), y.data_as<float>(), sizes, y.numel(), if_true, if_false);
  check_launch();
  return y;
}

Tensor structural_mask(const Problem& p, RunContext& ctx) {
  OpRange range(op::structural_mask.name, {});
  // Bounds of j - i (core/mask_geometry.h's band); a missing bound is one no
  // pair of the [seq, kv_seq] mask reaches, so None keeps every key.
  const auto band = geometry::band_of(p.mask, p.window, p.seq, p.kv_seq);
  const std::int64_t lo = band.has_lo ? band.lo() : -p.seq, hi = band.has_hi ? band.hi : p.kv_seq;
  Tensor m = Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, ctx.allocator);
  structural_mask_kernel<<<grid_for(m.numel()), kThreads, 0, stream_of(ctx)>>>(m.data_as<std::uint8_t>(), p.kv_seq,
                                                                               m.numel(), lo, hi);
  check_launch();
  return m;
}

}  // namespace attnprof::cuda::ops
