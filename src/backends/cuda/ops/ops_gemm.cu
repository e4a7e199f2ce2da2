// Batched matrix products of attention through cuBLAS.
//
// cuBLAS is column-major; a row-major [rows, cols] matrix with row stride ld is
// the column-major [cols, rows] matrix with leading dimension ld. So
//   scores = Q K^T  is  scores^T = K^T(op T on K) * Q  with m = Skv, n = S, k = D,
//   out    = P V    is  out^T    = V * P^T            with m = D,   n = S, k = Skv,
//   out    = A^T B  is  out^T    = B^T(op N) * A(op T) with m = N,   n = M, k = rows
// (the backward's dV = P^T dO and dK = dS^T Q, whose rows run over a group's
// query heads stacked, so the grouped-query sum is the GEMM's own).
// Batch runs over (batch, kv head, query head within the group); grouped query
// heads share one K/V matrix. When a group's query heads are consecutive rows
// ([B, H, S, D] contiguous), they are folded into one taller matrix, which is
// how GQA costs nothing extra here. The remaining batch dims become one
// strided-batched call where their strides allow, and a host loop otherwise
// (a [B, S, H, D] view, for instance, needs one call per batch).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <vector>

#include "backends/cuda/ops/ops.h"
#include "backends/cuda/ops/ops_common.h"

namespace attnprof::cuda::ops {
namespace {

using detail::OpRange;
using detail::stream_of;

// cuBLAS picks its split-K and stream-K kernels from this; PyTorch gives it the
// same on Hopper.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      fail(ErrorKind::Internal, "matmul: not a floating dtype");
  }
}

struct BatchDim {
  std::int64_t size;
  std::array<std::int64_t, 3> stride;  // of A, B, C
};

struct Gemm {
  cublasOperation_t ta, tb;
  std::int64_t m, n, k;
  const char *a, *b;
  char* c;
  std::int64_t lda, ldb, ldc;
  cudaDataType_t type;
  std::size_t esize;
};

// Drops size-1 dims and merges neighbours whose strides line up for all three
// operands, so a contiguous layout becomes one batch dim.
std::vector<BatchDim> simplify(const std::vector<BatchDim>& dims) {
  std::vector<BatchDim> out;
  for (const BatchDim& d : dims) {
    if (d.size == 1) continue;
    if (!out.empty()) {
      BatchDim& o = out.back();
      bool merge = true;
      for (int i = 0; i < 3; ++i) merge = merge && o.stride[i] == d.size * d.stride[i];
      if (merge) {
        o.size *= d.size;
        o.stride = d.stride;
        continue;
      }
    }
    out.push_back(d);
  }
  return out;
}

void run_gemm(cublasHandle_t h, const Gemm& g, std::vector<BatchDim> dims) {
  dims = simplify(dims);
  // The largest dim goes to cuBLAS; the others are looped here.
  BatchDim batched{1, {0, 0, 0}};
  if (!dims.empty()) {
    auto it = std::max_element(dims.begin(), dims.end(), [](auto& x, auto& y) { return x.size < y.size; });
    batched = *it;
    dims.erase(it);
  }
  if (batched.size > 0x7fffffff || g.m > 0x7fffffff || g.n > 0x7fffffff || g.k > 0x7fffffff) {
    fail(ErrorKind::Unsupported, "matmul: a dimension over 2^31 does not fit cuBLAS's int arguments");
  }
  std::int64_t loops = 1;
  for (const BatchDim& d : dims) loops *= d.size;
  const float alpha = 1.f, beta = 0.f;
  for (std::int64_t l = 0; l < loops; ++l) {
    std::array<std::int64_t, 3> off{0, 0, 0};
    std::int64_t r = l;
    for (const BatchDim& d : dims) {
      const std::int64_t idx = r % d.size;
      r /= d.size;
      for (int i = 0; i < 3; ++i) off[i] += idx * d.stride[i];
    }
    const auto bytes = [&](int i) { return off[i] * static_cast<std::int64_t>(g.esize); };
    ATTNPROF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, g.ta, g.tb, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha, g.a + bytes(0),
        g.type, static_cast<int>(g.lda), batched.stride[0], g.b + bytes(1), g.type, static_cast<int>(g.ldb),
        batched.stride[1], &beta, g.c + bytes(2), g.type, static_cast<int>(g.ldc), batched.stride[2],
        static_cast<int>(batched.size), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// cuBLAS reads a row-major [rows, d] matrix through its row stride: the head
// dim must be unit-stride and rows must not overlap.
bool gemm_readable(const Tensor& t) {
  const std::int64_t d = t.size(3);
  return (d == 1 || t.stride(3) == 1) && (t.size(2) == 1 || t.stride(2) >= d);
}

// Row stride as cuBLAS's leading dimension; a single row has none, so any
// value >= d is right.
std::int64_t leading_dim(const Tensor& t) {
  return t.size(2) == 1 ? std::max<std::int64_t>(t.size(3), 1) : t.stride(2);
}

// The rows of `group` consecutive heads read as one taller matrix: each head's
// rows follow the previous head's at the row stride.
bool heads_stack(const Tensor& t, std::int64_t group) {
  return gemm_readable(t) && (group == 1 || t.stride(1) == t.size(2) * leading_dim(t));
}

void check_shapes(const Tensor& q, const Tensor& kv, const char* op) {
  detail::require_cuda(q, op);
  detail::require_cuda(kv, op);
  if (q.dtype() != kv.dtype()) fail(ErrorKind::Internal, std::string(op) + ": operand dtypes differ");
  if (q.size(0) != kv.size(0) || kv.size(1) == 0 || q.size(1) % kv.size(1) != 0) {
    fail(ErrorKind::Internal, std::string(op) + ": " + q.describe() + " vs " + kv.describe());
  }
}

}  // namespace

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(handle_);  // no throw from a destructor
}

std::size_t blas_workspace_bytes() { return kWorkspaceBytes; }

cublasHandle_t Blas::bind(RunContext& ctx) {
  if (handle_ == nullptr) {
    ATTNPROF_CUBLAS_CHECK(cublasCreate(&handle_));
    // FP32 operands must stay SGEMM (what the math backend demonstrates), so
    // TF32 is never allowed whatever the defaults become.
    ATTNPROF_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  }
  if (!stream_set_ || stream_ != ctx.stream || !workspace_.defined()) {
    ATTNPROF_CUBLAS_CHECK(cublasSetStream(handle_, stream_of(ctx)));
    if (!workspace_.defined())
      workspace_ = Tensor::empty({1, 1, 1, static_cast<std::int64_t>(kWorkspaceBytes)}, DType::Bool, ctx.allocator);
    ATTNPROF_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), kWorkspaceBytes));
    stream_ = ctx.stream;
    stream_set_ = true;
  }
  return handle_;
}

Tensor matmul_qk(Blas& blas, const Tensor& q_in, const Tensor& k_in, RunContext& ctx) {
  OpRange range(op::matmul.name, {&q_in, &k_in});
  check_shapes(q_in, k_in, "matmul");
  const Tensor q = gemm_readable(q_in) ? q_in : contiguous(q_in, ctx);
  const Tensor k = gemm_readable(k_in) ? k_in : contiguous(k_in, ctx);
  const std::int64_t B = q.size(0), H = q.size(1), Hkv = k.size(1), G = H / Hkv, S = q.size(2), Skv = k.size(2),
                     D = q.size(3);
  Tensor scores = Tensor::empty({B, H, S, Skv}, q.dtype(), ctx.allocator);
  if (scores.numel() == 0) return scores;
  const std::size_t es = element_size(q.dtype());
  std::int64_t ldq = leading_dim(q), rows = S;
  // Grouped heads one under another in Q fold into one [G*S, D] matrix.
  const bool fold = G > 1 && q.stride(1) == S * ldq;
  if (fold) rows = G * S;
  const Gemm g{CUBLAS_OP_T,
               CUBLAS_OP_N,
               Skv,
               rows,
               D,
               static_cast<const char*>(k.data()),
               static_cast<const char*>(q.data()),
               static_cast<char*>(scores.data()),
               leading_dim(k),
               ldq,
               Skv,
               cuda_type(q.dtype()),
               es};
  std::vector<BatchDim> dims{{B, {k.stride(0), q.stride(0), H * S * Skv}},
                             {Hkv, {k.stride(1), G * q.stride(1), G * S * Skv}}};
  if (!fold) dims.push_back({G, {0, q.stride(1), S * Skv}});
  run_gemm(blas.bind(ctx), g, dims);
  return scores;
}

namespace {

// p @ v into out, whose head dim is unit-stride.
void pv_into(Blas& blas, const Tensor& p, const Tensor& v, Tensor& out, RunContext& ctx) {
  const std::int64_t B = p.size(0), H = p.size(1), Hkv = v.size(1), G = H / Hkv, S = p.size(2), Skv = p.size(3),
                     D = v.size(3);
  const std::int64_t ldo = leading_dim(out);
  const bool fold = G > 1 && out.stride(1) == S * ldo;
  const Gemm g{CUBLAS_OP_N,
               CUBLAS_OP_N,
               D,
               fold ? G * S : S,
               Skv,
               static_cast<const char*>(v.data()),
               static_cast<const char*>(p.data()),
               static_cast<char*>(out.data()),
               leading_dim(v),
               Skv,
               ldo,
               cuda_type(p.dtype()),
               element_size(p.dtype())};
  std::vector<BatchDim> dims{{B, {v.stride(0), H * S * Skv, out.stride(0)}},
                             {Hkv, {v.stride(1), G * S * Skv, G * out.stride(1)}}};
  if (!fold) dims.push_back({G, {0, S * Skv, out.stride(1)}});
  run_gemm(blas.bind(ctx), g, dims);
}

}  // namespace

void matmul_pv(Blas& blas, const Tensor& p, const Tensor& v_in, Tensor& out, RunContext& ctx) {
  OpRange range(op::matmul.name, {&p, &v_in});
  check_shapes(p, v_in, "matmul");
  if (!p.is_contiguous()) fail(ErrorKind::Internal, "matmul: probabilities must be contiguous");
  const Tensor v = gemm_readable(v_in) ? v_in : contiguous(v_in, ctx);
  if (out.sizes() != Dims{p.size(0), p.size(1), p.size(2), v.size(3)} || out.dtype() != p.dtype()) {
    fail(ErrorKind::Internal, "matmul: output " + out.describe() + " does not match " + p.describe());
  }
  if (out.numel() == 0) return;
  if (gemm_readable(out)) {
    pv_into(blas, p, v, out, ctx);
    return;
  }
  // cuBLAS cannot write a strided head dim: a contiguous result, then a copy
  // into place, as PyTorch's out= would do.
  Tensor tmp = Tensor::empty(out.sizes(), out.dtype(), ctx.allocator);
  pv_into(blas, p, v, tmp, ctx);
  to_into(tmp, out, ctx);
}

Tensor matmul_pv(Blas& blas, const Tensor& p, const Tensor& v, RunContext& ctx) {
  Tensor out = Tensor::empty({p.size(0), p.size(1), p.size(2), v.size(3)}, p.dtype(), ctx.allocator);
  matmul_pv(blas, p, v, out, ctx);
  return out;
}

namespace {

// a^T @ b into out, whose head dim is unit-stride; a and b stack their heads.
void tn_into(Blas& blas, const Tensor& a, const Tensor& b, Tensor& out, RunContext& ctx) {
  const std::int64_t B = a.size(0), Hkv = out.size(1), G = a.size(1) / Hkv, S = a.size(2), M = a.size(3), N = b.size(3);
  const Gemm g{CUBLAS_OP_N,
               CUBLAS_OP_T,
               N,
               M,
               G * S,
               static_cast<const char*>(b.data()),
               static_cast<const char*>(a.data()),
               static_cast<char*>(out.data()),
               leading_dim(b),
               leading_dim(a),
               leading_dim(out),
               cuda_type(a.dtype()),
               element_size(a.dtype())};
  run_gemm(blas.bind(ctx), g,
           {{B, {b.stride(0), a.stride(0), out.stride(0)}}, {Hkv, {G * b.stride(1), G * a.stride(1), out.stride(1)}}});
}

}  // namespace

void matmul_tn(Blas& blas, const Tensor& a_in, const Tensor& b_in, Tensor& out, RunContext& ctx) {
  OpRange range(op::matmul.name, {&a_in, &b_in});
  check_shapes(a_in, b_in, "matmul");
  check_shapes(a_in, out, "matmul");
  const std::int64_t group = a_in.size(1) / out.size(1);
  if (b_in.sizes() != Dims{a_in.size(0), a_in.size(1), a_in.size(2), b_in.size(3)} ||
      out.sizes() != Dims{a_in.size(0), out.size(1), a_in.size(3), b_in.size(3)}) {
    fail(ErrorKind::Internal, "matmul: " + a_in.describe() + "^T @ " + b_in.describe() + " into " + out.describe());
  }
  // An operand whose group cannot be read as one matrix (Q in a [B, S, H, D]
  // layout, say) is made contiguous first: one "contiguous" kernel rather
  // than a GEMM per query head.
  const Tensor a = heads_stack(a_in, group) ? a_in : contiguous(a_in, ctx);
  const Tensor b = heads_stack(b_in, group) ? b_in : contiguous(b_in, ctx);
  if (out.numel() == 0) return;
  if (gemm_readable(out)) {
    tn_into(blas, a, b, out, ctx);
    return;
  }
  Tensor tmp = Tensor::empty(out.sizes(), out.dtype(), ctx.allocator);
  tn_into(blas, a, b, tmp, ctx);
  to_into(tmp, out, ctx);
}

}  // namespace attnprof::cuda::ops
