// Row softmax over the last dim, PyTorch's NaN-safe softmax built from it, and
// the backward both share.
//
// One block per row: one pass keeps a running (max, sum of exp) per thread
// (online softmax), a block reduction merges them, a second pass writes
// exp(x - max) / sum. Rows of up to tens of thousands of keys stay in L1/L2
// between the two passes, so the kernel moves about one read and one write.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backends/cuda/ops/ops.h"
#include "backends/cuda/ops/ops_common.h"

namespace attnprof::cuda::ops {
namespace {

using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::OpRange;
using detail::stream_of;
using dev::Pack;

struct MaxSum {
  float m = -INFINITY;  // running max
  float s = 0.f;        // sum of exp(x - m)
};

// -inf terms contribute nothing; without the guard exp(-inf - -inf) would make
// a NaN out of any empty partial sum. A row of only -inf keeps m = -inf, s = 0.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  MaxSum r;
  r.m = m;
  r.s = (a.m == -INFINITY ? 0.f : a.s * expf(a.m - m)) + (b.m == -INFINITY ? 0.f : b.s * expf(b.m - m));
  return r;
}

__device__ __forceinline__ MaxSum add_value(MaxSum a, float x) {
  if (x == -INFINITY) return a;
  if (!(x <= a.m)) {  // also taken for NaN, which then poisons the row as in PyTorch
    a.s = (a.m == -INFINITY ? 0.f : a.s * expf(a.m - x)) + 1.f;
    a.m = x;
  } else {
    a.s += expf(x - a.m);
  }
  return a;
}

__device__ MaxSum block_reduce(MaxSum v) {
  __shared__ float sm[32], ss[32];
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other;
    other.m = __shfl_xor_sync(0xffffffffu, v.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, v.s, o);
    v = merge(v, other);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) sm[warp] = v.m, ss[warp] = v.s;
  __syncthreads();
  if (warp == 0) {
    MaxSum w;
    if (lane < warps) w.m = sm[lane], w.s = ss[lane];
    for (int o = 16; o > 0; o >>= 1) {
      MaxSum other;
      other.m = __shfl_xor_sync(0xffffffffu, w.m, o);
      other.s = __shfl_xor_sync(0xffffffffu, w.s, o);
      w = merge(w, other);
    }
    if (lane == 0) sm[0] = w.m, ss[0] = w.s;
  }
  __syncthreads();
  return MaxSum{sm[0], ss[0]};
}

template <class T, int N>
__global__ void softmax_kernel(const T* x, T* y, std::int64_t cols) {
  const std::int64_t row = blockIdx.x;
  const auto* in = reinterpret_cast<const Pack<T, N>*>(x + row * cols);
  auto* out = reinterpret_cast<Pack<T, N>*>(y + row * cols);
  const std::int64_t packs = cols / N;
  MaxSum acc;
  for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<T, N> v = in[p];
#pragma unroll
    for (int t = 0; t < N; ++t) acc = add_value(acc, dev::load(v.v, t));
  }
  const MaxSum r = block_reduce(acc);
  // All -inf: exp(-inf - -inf) is NaN in plain softmax; say so directly.
  const float inv = r.m == -INFINITY ? NAN : 1.f / r.s;
  for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    Pack<T, N> v = in[p];
#pragma unroll
    for (int t = 0; t < N; ++t) dev::store(v.v, t, expf(dev::load(v.v, t) - r.m) * inv);
    out[p] = v;
  }
}

template <class T>
__global__ void eq_kernel(const T* x, std::uint8_t* y, std::int64_t n, float value) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < n;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    y[e] = dev::load(x, e) == value;
  }
}

// One warp per row: all(x[row, :]).
__global__ void all_kernel(const std::uint8_t* x, std::uint8_t* y, std::int64_t rows, std::int64_t cols) {
  const std::int64_t warps = std::int64_t{gridDim.x} * blockDim.x / 32;
  for (std::int64_t row = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32; row < rows; row += warps) {
    bool all = true;
    for (std::int64_t c = threadIdx.x % 32; c < cols; c += 32) all = all && x[row * cols + c];
    all = __all_sync(0xffffffffu, all);
    if (threadIdx.x % 32 == 0) y[row] = all;
  }
}

// where(row_flag, 0, x): zeros the rows whose flag is set.
template <class T>
__global__ void zero_rows_kernel(const std::uint8_t* flag, const T* x, T* y, std::int64_t n, std::int64_t cols) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < n;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    dev::store(y, e, flag[e / cols] ? 0.f : dev::load(x, e));
  }
}

__device__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? partial[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (lane == 0) partial[0] = w;
  }
  __syncthreads();
  return partial[0];
}

// out = p * (g - sum_j g_j p_j) over one row a block: a pass for the dot
// product, a second (from L1/L2) for the result.
template <class T, class Tp>
__global__ void softmax_backward_kernel(const T* grad, const Tp* probs, T* out, std::int64_t cols) {
  const std::int64_t base = std::int64_t{blockIdx.x} * cols;
  float dot = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    dot += dev::load(grad, base + j) * dev::load(probs, base + j);
  }
  dot = block_sum(dot);
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    dev::store(out, base + j, dev::load(probs, base + j) * (dev::load(grad, base + j) - dot));
  }
}

// Enough threads that each moves one 16-byte pack per pass on short rows, and
// several on long ones.
int softmax_threads(std::int64_t packs) {
  const std::int64_t t = (packs + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 512 ? 512 : t));
}

template <class T>
void launch_softmax(const Tensor& x, Tensor& y, cudaStream_t s) {
  const std::int64_t cols = x.size(3), rows = x.numel() / cols;
  constexpr int w = static_cast<int>(16 / sizeof(T));
  const bool aligned = reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(y.data()) % 16 == 0 && cols % w == 0;
  if (aligned) {
    softmax_kernel<T, w>
        <<<static_cast<unsigned>(rows), softmax_threads(cols / w), 0, s>>>(x.data_as<T>(), y.data_as<T>(), cols);
  } else {
    softmax_kernel<T, 1>
        <<<static_cast<unsigned>(rows), softmax_threads(cols), 0, s>>>(x.data_as<T>(), y.data_as<T>(), cols);
  }
  check_launch();
}

void require_scores(const Tensor& x, const char* op) {
  detail::require_cuda(x, op);
  if (!x.is_contiguous())
    fail(ErrorKind::Internal, std::string(op) + " expects contiguous scores, got " + x.describe());
  if (x.numel() / x.size(3) > 0x7fffffff) fail(ErrorKind::Unsupported, std::string(op) + ": more than 2^31 rows");
}

}  // namespace

Tensor softmax(const Tensor& x, RunContext& ctx) {
  OpRange range(op::softmax.name, {&x});
  require_scores(x, "softmax");
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), ctx.allocator);
  ATTNPROF_DISPATCH_FLOAT(x.dtype(), T, [&] { launch_softmax<T>(x, y, stream_of(ctx)); });
  return y;
}

Tensor safe_softmax(const Tensor& x, RunContext& ctx) {
  OpRange range(op::safe_softmax.name, {&x});
  require_scores(x, "_safe_softmax");
  const cudaStream_t s = stream_of(ctx);
  Tensor out = softmax(x, ctx);
  const std::int64_t n = x.numel(), cols = x.size(3), rows = n / cols;
  Tensor masked = Tensor::empty(x.sizes(), DType::Bool, ctx.allocator);
  {
    OpRange eq("eq", {&x}, /*scalar=*/true);
    ATTNPROF_DISPATCH_FLOAT(x.dtype(), T, [&] {
      eq_kernel<T><<<grid_for(n), kThreads, 0, s>>>(x.data_as<T>(), masked.data_as<std::uint8_t>(), n, -INFINITY);
    });
    check_launch();
  }
  Tensor masked_rows = Tensor::empty({x.size(0), x.size(1), x.size(2), 1}, DType::Bool, ctx.allocator);
  {
    OpRange all("all", {&masked});
    all_kernel<<<grid_for(rows * 32), kThreads, 0, s>>>(masked.data_as<std::uint8_t>(),
                                                        masked_rows.data_as<std::uint8_t>(), rows, cols);
    check_launch();
  }
  masked = Tensor();
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), ctx.allocator);
  {
    OpRange where("where", {&masked_rows, &out}, /*scalar=*/true);
    ATTNPROF_DISPATCH_FLOAT(x.dtype(), T, [&] {
      zero_rows_kernel<T><<<grid_for(n), kThreads, 0, s>>>(masked_rows.data_as<std::uint8_t>(), out.data_as<T>(),
                                                           y.data_as<T>(), n, cols);
    });
    check_launch();
  }
  return y;
}

Tensor softmax_backward(const Tensor& grad, const Tensor& probs, RunContext& ctx) {
  OpRange range(op::softmax_backward.name, {&grad, &probs});
  require_scores(grad, "_softmax_backward_data");
  require_scores(probs, "_softmax_backward_data");
  if (grad.sizes() != probs.sizes()) {
    fail(ErrorKind::Internal, "_softmax_backward_data: " + grad.describe() + " vs " + probs.describe());
  }
  Tensor out = Tensor::empty(grad.sizes(), grad.dtype(), ctx.allocator);
  const std::int64_t cols = grad.size(3), rows = grad.numel() / cols;
  if (rows == 0) return out;
  ATTNPROF_DISPATCH_FLOAT(grad.dtype(), T, [&] {
    ATTNPROF_DISPATCH_FLOAT(probs.dtype(), Tp, [&] {
      softmax_backward_kernel<T, Tp><<<static_cast<unsigned>(rows), softmax_threads(cols), 0, stream_of(ctx)>>>(
          grad.data_as<T>(), probs.data_as<Tp>(), out.data_as<T>(), cols);
    });
  });
  check_launch();
  return out;
}

}  // namespace attnprof::cuda::ops
