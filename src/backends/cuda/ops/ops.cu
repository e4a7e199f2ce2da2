// Elementwise ops and the paged cache's gather of the unfused CUDA backends
// (the mask builders are ops_masks.cu's): one plain memory-bound kernel each,
// as PyTorch launches them, so the kernel counts and the memory traffic of the
// naive and math backends are the reference's.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/ops/ops.h"
#include "backends/cuda/ops/ops_common.h"

namespace attnprof::cuda::ops {
namespace {

using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::OpRange;
using detail::require_contiguous;
using detail::stream_of;
using dev::Pack;

// Index of a [B, H, S, C] element's (b, h, i) pieces from its row number.
struct RowIndex {
  std::int64_t heads, rows, cols;  // H, S, C
  __device__ std::int64_t offset(std::int64_t row, const Dims& s) const {
    const std::int64_t i = row % rows, bh = row / rows;
    return (bh / heads) * s[0] + (bh % heads) * s[1] + i * s[2];
  }
};

// The elementwise maps of contiguous tensors, in FP32 as PyTorch's kernels
// compute 16-bit elements: x * s (mul); tanh; and tanh's backward, grad *
// (1 - t^2) from tanh's output t (the second operand, read beside x).
struct Scale {
  float s;
  __device__ float operator()(float x, float) const { return x * s; }
};
struct Tanh {
  __device__ float operator()(float x, float) const { return tanhf(x); }
};
struct TanhBackward {
  __device__ float operator()(float grad, float t) const { return grad * (1.f - t * t); }
};

// y = f(x, x2) over `packs` packs of N elements (x2 is read only when given).
template <class T, int N, class F>
__global__ void map_kernel(const T* x, const T* x2, T* y, std::int64_t packs, F f) {
  for (std::int64_t p = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += std::int64_t{gridDim.x} * blockDim.x) {
    Pack<T, N> v = reinterpret_cast<const Pack<T, N>*>(x)[p];
    Pack<T, N> w{};
    if (x2 != nullptr) w = reinterpret_cast<const Pack<T, N>*>(x2)[p];
#pragma unroll
    for (int t = 0; t < N; ++t) dev::store(v.v, t, f(dev::load(v.v, t), dev::load(w.v, t)));
    reinterpret_cast<Pack<T, N>*>(y)[p] = v;
  }
}

// Writes `value` where keep is false; only masked elements are stored, since a
// fill never needs to read what it overwrites. One block walks whole rows, so
// the (batch, head, row) offset of the mask is worked out once a row, not with
// 64-bit divisions per element (which made this a compute-bound 308 us for
// 256 MiB of scores on an H200). A group of N elements whose keep bytes are
// all false is one 16-byte store; kVecMask: the N keep bytes are contiguous
// and aligned, read as one word.
template <class T, int N, bool kVecMask>
__global__ void fill_kernel(T* x, const std::uint8_t* keep, Dims ks, RowIndex ri, std::int64_t rows, float value) {
  const std::int64_t groups = ri.cols / N;
  Pack<T, N> full;
#pragma unroll
  for (int t = 0; t < N; ++t) dev::store(full.v, t, value);
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::uint8_t* k = keep + ri.offset(row, ks);
    T* xr = x + row * ri.cols;
    for (std::int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      const std::int64_t j = g * N;
      bool masked[N];
      if constexpr (kVecMask) {
        using Word =
            std::conditional_t<N == 8, std::uint64_t, std::conditional_t<N == 4, std::uint32_t, std::uint16_t>>;
        static_assert(N == 2 || N == 4 || N == 8, "one word of keep bytes");
        const Word w = *reinterpret_cast<const Word*>(k + j);
#pragma unroll
        for (int t = 0; t < N; ++t) masked[t] = ((w >> (8 * t)) & 0xff) == 0;
      } else {
#pragma unroll
        for (int t = 0; t < N; ++t) masked[t] = k[(j + t) * ks[3]] == 0;
      }
      bool all = true, any = false;
#pragma unroll
      for (int t = 0; t < N; ++t) all &= masked[t], any |= masked[t];
      if (all && N > 1) {
        reinterpret_cast<Pack<T, N>*>(xr)[g] = full;
      } else if (any) {
#pragma unroll
        for (int t = 0; t < N; ++t) {
          if (masked[t]) dev::store(xr, j + t, value);
        }
      }
    }
  }
}

// x + m for a score x and an additive mask m (add and add_ take only those):
// -inf where m is -inf, whatever x is, so a masked key's NaN or inf score
// stays hidden, as on the CPU (ops.cpp's masked_add), in the float64
// reference and in the fused kernels (IEEE's NaN + -inf would put the NaN in
// every row the mask hides it from: issue 57 item 5).
__device__ __forceinline__ float masked_add(float x, float m) { return m == -INFINITY ? -INFINITY : x + m; }

template <class Ta, class Tb, int N>
__global__ void add_kernel(const Ta* a, const Tb* b, Dims bs, Ta* out, RowIndex ri, std::int64_t packs) {
  for (std::int64_t p = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t e = p * N, row = e / ri.cols, j = e - row * ri.cols;
    const Tb* bp = b + ri.offset(row, bs) + j * bs[3];
    Pack<Ta, N> v = reinterpret_cast<const Pack<Ta, N>*>(a)[p];
#pragma unroll
    for (int t = 0; t < N; ++t) dev::store(v.v, t, masked_add(dev::load(v.v, t), dev::load(bp, t * bs[3])));
    reinterpret_cast<Pack<Ta, N>*>(out)[p] = v;
  }
}

// Strided-to-strided copy with conversion and an optional factor, one element a
// thread: used on Q, K, V and the output, which are seq/head_dim times smaller
// than the score buffers.
template <class Ti, class To>
__global__ void convert_kernel(const Ti* src, Dims ss, To* dst, Dims ds, Dims n, std::int64_t total, float s) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const dev::Index4 idx(e, n);
    dev::store(dst, idx.at(ds), dev::load(src, idx.at(ss)) * s);
  }
}

// e4m3 (the OCP "fn" format, what torch.float8_e4m3fn holds) to FP32 times
// the tensor's descale: the hardware conversion widens exactly, the product
// is FP32's one rounding, as the CPU's dequantize makes it.
__global__ void dequantize_kernel(const __nv_fp8_e4m3* src, Dims ss, float* dst, Dims n, std::int64_t total,
                                  float descale) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const dev::Index4 idx(e, n);
    dst[e] = static_cast<float>(src[idx.at(ss)]) * descale;
  }
}

// What a page gather walks: out [B, H, kv_seq, D] contiguous from pages
// [num_pages, H, page, D] contiguous, through a table with strides
// table_b (over sequences) and table_l (over logical pages).
struct PagedShape {
  std::int64_t heads, kv_seq, page, num_pages, table_b, table_l;
};

// One thread a pack of N elements of one key row (row_packs packs a row):
// the row's physical page is one int32 load, which every pack of a page shares
// through the cache. A table entry that is no physical page gives a NaN row
// instead of a read outside the cache (ops.h says why it is not refused).
template <class T, int N>
__global__ void gather_pages_kernel(const T* pages, const std::int32_t* table, T* out, PagedShape g,
                                    std::int64_t row_packs, std::int64_t packs) {
  for (std::int64_t p = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = p / row_packs, c = p - r * row_packs;
    const std::int64_t j = r % g.kv_seq, bh = r / g.kv_seq, h = bh % g.heads, b = bh / g.heads;
    const std::int64_t phys = table[b * g.table_b + (j / g.page) * g.table_l];
    Pack<T, N> v;
    if (phys < 0 || phys >= g.num_pages) {
#pragma unroll
      for (int t = 0; t < N; ++t) dev::store(v.v, t, __int_as_float(0x7fc00000));
    } else {
      v = reinterpret_cast<const Pack<T, N>*>(pages)[((phys * g.heads + h) * g.page + j % g.page) * row_packs + c];
    }
    reinterpret_cast<Pack<T, N>*>(out)[p] = v;
  }
}

// Elements moved per 16-byte pack when every row and the base allow it.
template <class T>
int pack_width(const Tensor& t, std::int64_t cols) {
  constexpr int n = static_cast<int>(16 / sizeof(T));
  const bool aligned = reinterpret_cast<std::uintptr_t>(t.data()) % 16 == 0;
  return (aligned && cols % n == 0) ? n : 1;
}

RowIndex row_index(const Tensor& x) { return RowIndex{x.size(1), x.size(2), x.size(3)}; }

template <class T>
void launch_fill(Tensor& x, const Tensor& keep, float value, cudaStream_t s) {
  const Dims ks = detail::broadcast_strides(keep, x.sizes());
  const auto* k = keep.data_as<std::uint8_t>();
  T* p = x.data_as<T>();
  const std::int64_t rows = x.numel() / x.size(3);
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(rows, 1 << 20));
  constexpr int n = static_cast<int>(16 / sizeof(T));
  // The keep bytes of a group are one aligned word when the mask's last dim is
  // contiguous and every row of it starts on an n-byte boundary.
  const bool vec_mask =
      ks[3] == 1 && reinterpret_cast<std::uintptr_t>(k) % n == 0 && ks[0] % n == 0 && ks[1] % n == 0 && ks[2] % n == 0;
  if (pack_width<T>(x, x.size(3)) == n) {
    if (vec_mask) {
      fill_kernel<T, n, true><<<grid, 128, 0, s>>>(p, k, ks, row_index(x), rows, value);
    } else {
      fill_kernel<T, n, false><<<grid, 128, 0, s>>>(p, k, ks, row_index(x), rows, value);
    }
  } else {
    fill_kernel<T, 1, false><<<grid, 128, 0, s>>>(p, k, ks, row_index(x), rows, value);
  }
  check_launch();
}

template <class Ta, class Tb>
void launch_add(const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t s) {
  const Dims bs = detail::broadcast_strides(b, a.sizes());
  const int n = pack_width<Ta>(a, a.size(3)) == 1 || pack_width<Ta>(out, a.size(3)) == 1 ? 1 : 16 / sizeof(Ta);
  auto go = [&](auto width) {
    constexpr int w = decltype(width)::value;
    add_kernel<Ta, Tb, w><<<grid_for(a.numel() / w), kThreads, 0, s>>>(a.data_as<Ta>(), b.data_as<Tb>(), bs,
                                                                       out.data_as<Ta>(), row_index(a), a.numel() / w);
  };
  if (n == 1)
    go(std::integral_constant<int, 1>{});
  else
    go(std::integral_constant<int, static_cast<int>(16 / sizeof(Ta))>{});
  check_launch();
}

void add_impl(const Tensor& a, const Tensor& b, Tensor& out, RunContext& ctx) {
  require_contiguous(a, "add");
  detail::require_cuda(b, "add");
  ATTNPROF_DISPATCH_FLOAT(a.dtype(), Ta, [&] {
    ATTNPROF_DISPATCH_FLOAT(b.dtype(), Tb, [&] { launch_add<Ta, Tb>(a, b, out, stream_of(ctx)); });
  });
}

void convert(const Tensor& src, Tensor& dst, RunContext& ctx, float s = 1.f) {
  detail::require_cuda(src, "to");
  detail::require_cuda(dst, "to");
  if (src.sizes() != dst.sizes()) fail(ErrorKind::Internal, "to: " + src.describe() + " into " + dst.describe());
  const std::int64_t n = src.numel();
  ATTNPROF_DISPATCH_FLOAT(src.dtype(), Ti, [&] {
    ATTNPROF_DISPATCH_FLOAT(dst.dtype(), To, [&] {
      convert_kernel<Ti, To><<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(
          src.data_as<Ti>(), src.strides(), dst.data_as<To>(), dst.strides(), src.sizes(), n, s);
    });
  });
  check_launch();
}

// f over contiguous x (and x2, of x's sizes and dtype) into a fresh y, in
// 16-byte packs where every pointer allows them.
template <class F>
Tensor map(const Tensor& x, const Tensor* x2, F f, RunContext& ctx) {
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), ctx.allocator);
  ATTNPROF_DISPATCH_FLOAT(x.dtype(), T, [&] {
    constexpr int w = static_cast<int>(16 / sizeof(T));
    const T* second = x2 != nullptr ? x2->data_as<T>() : nullptr;
    const bool packed = x.numel() % w == 0 && pack_width<T>(x, w) == w && pack_width<T>(y, w) == w &&
                        (x2 == nullptr || pack_width<T>(*x2, w) == w);
    if (packed) {
      map_kernel<T, w><<<grid_for(x.numel() / w), kThreads, 0, stream_of(ctx)>>>(x.data_as<T>(), second, y.data_as<T>(),
                                                                                 x.numel() / w, f);
    } else {
      map_kernel<T, 1>
          <<<grid_for(x.numel()), kThreads, 0, stream_of(ctx)>>>(x.data_as<T>(), second, y.data_as<T>(), x.numel(), f);
    }
  });
  check_launch();
  return y;
}

}  // namespace

Tensor mul(const Tensor& x, float s, RunContext& ctx) {
  OpRange range(op::mul.name, {&x}, /*scalar=*/true);
  detail::require_cuda(x, "mul");
  if (!x.is_contiguous()) {  // e.g. FP32 Q in a [B, S, H, D] layout
    Tensor y = Tensor::empty(x.sizes(), x.dtype(), ctx.allocator);
    convert(x, y, ctx, s);
    return y;
  }
  return map(x, nullptr, Scale{s}, ctx);
}

Tensor tanh(const Tensor& x, RunContext& ctx) {
  OpRange range(op::tanh.name, {&x});
  require_contiguous(x, "tanh");
  return map(x, nullptr, Tanh{}, ctx);
}

Tensor tanh_backward(const Tensor& grad, const Tensor& t, RunContext& ctx) {
  OpRange range(op::tanh_backward.name, {&grad, &t});
  require_contiguous(grad, "tanh_backward");
  require_contiguous(t, "tanh_backward");
  if (t.sizes() != grad.sizes() || t.dtype() != grad.dtype()) {
    fail(ErrorKind::Internal, "tanh_backward: " + grad.describe() + " vs " + t.describe());
  }
  return map(grad, &t, TanhBackward{}, ctx);
}

Tensor masked_fill(const Tensor& x, const Tensor& keep, float value, RunContext& ctx) {
  OpRange range(op::masked_fill.name, {&x, &keep}, /*scalar=*/true);
  require_contiguous(x, "masked_fill");
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), ctx.allocator);
  {
    // PyTorch's out-of-place masked_fill is clone() + masked_fill_(): the clone
    // is a cudaMemcpyAsync, a device-to-device copy on the trace.
    OpRange copy("copy_", {&y, &x});
    ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), x.nbytes(), cudaMemcpyDeviceToDevice, stream_of(ctx)));
  }
  masked_fill_(y, keep, value, ctx);
  return y;
}

void masked_fill_(Tensor& x, const Tensor& keep, float value, RunContext& ctx) {
  OpRange range(op::masked_fill_.name, {&x, &keep}, /*scalar=*/true);
  require_contiguous(x, "masked_fill_");
  detail::require_cuda(keep, "masked_fill_ mask");
  if (keep.dtype() != DType::Bool) fail(ErrorKind::Internal, "masked_fill_ needs a bool mask, got " + keep.describe());
  ATTNPROF_DISPATCH_FLOAT(x.dtype(), T, [&] { launch_fill<T>(x, keep, value, stream_of(ctx)); });
}

Tensor add(const Tensor& a, const Tensor& b, RunContext& ctx) {
  OpRange range(op::add.name, {&a, &b});
  Tensor out = Tensor::empty(a.sizes(), a.dtype(), ctx.allocator);
  add_impl(a, b, out, ctx);
  return out;
}

void add_(Tensor& a, const Tensor& b, RunContext& ctx) {
  OpRange range(op::add_.name, {&a, &b});
  add_impl(a, b, a, ctx);
}

Tensor to(const Tensor& x, DType dtype, RunContext& ctx) {
  OpRange range(op::to.name, {&x});
  Tensor y = Tensor::empty(x.sizes(), dtype, ctx.allocator);
  convert(x, y, ctx);
  return y;
}

void to_into(const Tensor& src, Tensor& dst, RunContext& ctx) {
  OpRange range(op::to.name, {&src});
  convert(src, dst, ctx);
}

Tensor dequantize(const Tensor& x, float descale, RunContext& ctx) {
  OpRange range(op::dequantize.name, {&x}, /*scalar=*/true);
  detail::require_cuda(x, "dequantize");
  if (x.dtype() != DType::F8E4M3) fail(ErrorKind::Internal, "dequantize takes e4m3 tensors, got " + x.describe());
  Tensor y = Tensor::empty(x.sizes(), DType::F32, ctx.allocator);
  const std::int64_t n = x.numel();
  dequantize_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(x.data_as<__nv_fp8_e4m3>(), x.strides(),
                                                                  y.data_as<float>(), x.sizes(), n, descale);
  check_launch();
  return y;
}

Tensor contiguous(const Tensor& x, RunContext& ctx) {
  OpRange range("contiguous", {&x});
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), ctx.allocator);
  convert(x, y, ctx);
  return y;
}

Tensor gather_pages(const Tensor& pages, const Tensor& block_table, std::int64_t kv_seq, RunContext& ctx) {
  OpRange range(op::gather_pages.name, {&pages, &block_table});
  require_contiguous(pages, "index_select");
  detail::require_cuda(block_table, "index_select's block table");
  if (block_table.dtype() != DType::I32) {
    fail(ErrorKind::Internal, "index_select: want an int32 block table, got " + block_table.describe());
  }
  const std::int64_t B = block_table.size(2), H = pages.size(1), page = pages.size(2), D = pages.size(3);
  if (page <= 0 || block_table.size(3) * page < kv_seq) {
    fail(ErrorKind::Internal, "index_select: " + std::to_string(block_table.size(3)) + " pages of " +
                                  std::to_string(page) + " keys cannot hold " + std::to_string(kv_seq));
  }
  Tensor out = Tensor::empty({B, H, kv_seq, D}, pages.dtype(), ctx.allocator);
  const PagedShape g{.heads = H,
                     .kv_seq = kv_seq,
                     .page = page,
                     .num_pages = pages.size(0),
                     .table_b = block_table.stride(2),
                     .table_l = block_table.stride(3)};
  ATTNPROF_DISPATCH_FLOAT(pages.dtype(), T, [&] {
    constexpr int n = static_cast<int>(16 / sizeof(T));
    const auto go = [&](auto width) {
      constexpr int w = decltype(width)::value;
      const std::int64_t packs = out.numel() / w;
      gather_pages_kernel<T, w><<<grid_for(packs), kThreads, 0, stream_of(ctx)>>>(
          pages.data_as<T>(), block_table.data_as<std::int32_t>(), out.data_as<T>(), g, D / w, packs);
    };
    if (pack_width<T>(pages, D) == n && pack_width<T>(out, D) == n) {
      go(std::integral_constant<int, n>{});
    } else {
      go(std::integral_constant<int, 1>{});
    }
  });
  check_launch();
  return out;
}

}  // namespace attnprof::cuda::ops
