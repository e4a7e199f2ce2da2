#include "backends/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/cpu_backends.h"

namespace attnprof::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// x + m for a score x and an additive mask m (add and add_ take only those):
// -inf where m is -inf, whatever x is, so a masked key's NaN or inf score
// stays hidden, as the float64 reference and the fused kernels hide it
// (IEEE's NaN + -inf would put the NaN in every row the mask hides it from).
inline float masked_add(float x, float m) { return m == kNegInf ? kNegInf : x + m; }

std::int64_t rows_of(const Tensor& t) { return t.size(0) * t.size(1) * t.size(2); }

// Applies f(row index r, b, h, i) over every row of a [B, H, R, C] tensor, in parallel.
template <class F>
void for_each_row(const Tensor& t, F&& f) {
  const std::int64_t H = t.size(1), R = t.size(2);
  const std::int64_t n = rows_of(t);
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < n; ++r) f(r / (H * R), (r / R) % H, r % R);
}

void load_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, float* dst) {
  load_run_as_float(t.data(), t.dtype(), t.index(b, h, i, 0), t.size(3), t.stride(3), dst);
}

void store_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, const float* src) {
  store_run_from_float(t.data(), t.dtype(), t.index(b, h, i, 0), t.size(3), t.stride(3), src);
}

// The row loop every elementwise op shares: each row of `src` widened to
// FP32, handed to f(row, cols, b, h, i), and stored into the same row of `dst`
// (which may be `src` itself).
template <class F>
void transform_rows(const Tensor& src, const Tensor& dst, F&& f) {
  const std::int64_t C = src.size(3);
  for_each_row(src, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    thread_local std::vector<float> row;
    row.resize(static_cast<std::size_t>(C));
    load_row(src, b, h, i, row.data());
    f(row.data(), C, b, h, i);
    store_row(dst, b, h, i, row.data());
  });
}

// Elementwise op over rows, into a new tensor of dtype `out`.
template <class F>
Tensor map_rows(const Tensor& x, DType out, Allocator& a, F&& f) {
  Tensor y = Tensor::empty(x.sizes(), out, a);
  transform_rows(x, y, f);
  return y;
}

template <class F>
void update_rows(Tensor& x, F&& f) {
  transform_rows(x, x, f);
}

// One (batch, head) slice as a row-major FP32 matrix: a pointer into the
// tensor when it already is one, else a widened copy in `scratch`.
const float* fp32_slice(const Tensor& t, std::int64_t b, std::int64_t h, std::vector<float>& scratch,
                        std::int64_t& ld) {
  const std::int64_t R = t.size(2), C = t.size(3);
  if (t.dtype() == DType::F32 && t.stride(3) == 1 && t.stride(2) >= C) {
    ld = t.stride(2);
    return t.data_as<const float>() + t.index(b, h, 0, 0);
  }
  scratch.resize(static_cast<std::size_t>(R * C));
  for (std::int64_t i = 0; i < R; ++i) load_row(t, b, h, i, scratch.data() + i * C);
  ld = C;
  return scratch.data();
}

// y read as if expanded to x's shape (stride 0 on its size-1 dims), so the
// row loops can index it with x's (b, h, i).
Tensor broadcast_to(const Tensor& y, const Tensor& x, const char* op) {
  if (y.sizes() == x.sizes()) return y;
  for (int d = 0; d < 4; ++d) {
    if (y.size(d) != 1 && y.size(d) != x.size(d)) {
      fail(ErrorKind::InvalidArgument,
           std::string(op) + ": " + y.describe() + " does not broadcast to " + x.describe());
    }
  }
  return y.expand(x.sizes());
}

// Keeps x[.., i, j] where j - i <= diagonal (upper = false) or >= (upper = true).
Tensor triangle(const OpSpec& spec, const Tensor& x, std::int64_t diagonal, bool upper, Allocator& a) {
  RecordFunction rf(spec.name, "bool, Scalar", dims_string(x) + ", []");
  if (x.dtype() != DType::Bool) fail(ErrorKind::Internal, std::string(spec.name) + " here builds bool masks only");
  Tensor y = Tensor::empty(x.sizes(), DType::Bool, a);
  const auto* in = x.data_as<const std::uint8_t>();
  auto* out = y.data_as<std::uint8_t>();
  const std::int64_t R = x.size(2), C = x.size(3), rows = x.size(0) * x.size(1) * R;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % R, b = r / (x.size(1) * R), h = (r / R) % x.size(1);
    for (std::int64_t j = 0; j < C; ++j) {
      const bool in_band = upper ? (j - i >= diagonal) : (j - i <= diagonal);
      out[r * C + j] = in_band ? in[x.index(b, h, i, j)] : std::uint8_t{0};
    }
  }
  return y;
}

}  // namespace

std::string dims_string(const Dims& d) { return attnprof::dims_string(d); }

std::string dims_string(const Tensor& t) { return t.dims_string(); }

std::string dtypes_string(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) {
    if (!s.empty()) s += ", ";
    s += dtype_name(t->dtype());
  }
  return s;
}

namespace {

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::Cpu; }

  // 16-bit products stay FP32 here: the distribution's OpenBLAS (Debian 12's
  // 0.3.21) exports no bf16 GEMM (cblas_sbgemm) and none for fp16, and where
  // one exists its rounding would make the composites differ from the float64
  // check's yardstick, math (Traits::reference_precision computes in FP32);
  // the machine's bf16 products are the flash kernels' (flash_bf16_kernels.h).
  std::string describe_gemm(DType operands) const override {
    if (!is_16bit(operands)) return "OpenBLAS sgemm";
    return std::string("OpenBLAS sgemm on ") + std::string(dtype_name(operands)) + " widened to FP32 per head" +
           (has_sbgemm() ? " (kept FP32: math is the 16-bit tolerance's FP32 yardstick)"
                         : " (this OpenBLAS exports no bf16 GEMM, cblas_sbgemm)");
  }

  std::size_t library_workspace_bytes() const override { return 0; }

  Tensor matmul_qk(const Tensor& q, const Tensor& k, RunContext& ctx) override {
    RecordFunction rf(op::matmul.name, dtypes_string({&q, &k}), dims_string(q) + ", " + dims_string(k));
    const std::int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3), Skv = k.size(2);
    const std::int64_t group = H / k.size(1);
    // 16-bit operands are widened to FP32 per head, multiplied in FP32 and the
    // product rounded to q's dtype.
    Tensor s = Tensor::empty({B, H, S, Skv}, q.dtype(), ctx.allocator);
    std::vector<float> qs, ks, cs;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        std::int64_t ldq = 0, ldk = 0;
        const float* qp = fp32_slice(q, b, h, qs, ldq);
        const float* kp = fp32_slice(k, b, h / group, ks, ldk);
        float* c = nullptr;
        if (s.dtype() == DType::F32) {
          c = s.data_as<float>() + s.index(b, h, 0, 0);
        } else {
          cs.resize(static_cast<std::size_t>(S * Skv));
          c = cs.data();
        }
        sgemm(true, static_cast<int>(S), static_cast<int>(Skv), static_cast<int>(D), 1.0f, qp, static_cast<int>(ldq),
              kp, static_cast<int>(ldk), 0.0f, c, static_cast<int>(Skv));
        if (s.dtype() != DType::F32) {
          for (std::int64_t i = 0; i < S; ++i) store_row(s, b, h, i, c + i * Skv);
        }
      }
    }
    return s;
  }

  void matmul_pv(const Tensor& p, const Tensor& v, Tensor& out, RunContext&) override {
    RecordFunction rf(op::matmul.name, dtypes_string({&p, &v}), dims_string(p) + ", " + dims_string(v));
    const std::int64_t B = p.size(0), H = p.size(1), S = p.size(2), Skv = p.size(3), D = v.size(3);
    const std::int64_t group = H / v.size(1);
    std::vector<float> ps, vs, cs(static_cast<std::size_t>(S * D));
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        std::int64_t ldp = 0, ldv = 0;
        const float* pp = fp32_slice(p, b, h, ps, ldp);
        const float* vp = fp32_slice(v, b, h / group, vs, ldv);
        sgemm(false, static_cast<int>(S), static_cast<int>(D), static_cast<int>(Skv), 1.0f, pp, static_cast<int>(ldp),
              vp, static_cast<int>(ldv), 0.0f, cs.data(), static_cast<int>(D));
        for (std::int64_t i = 0; i < S; ++i) store_row(out, b, h, i, cs.data() + i * D);
      }
    }
  }

  Tensor matmul_pv(const Tensor& p, const Tensor& v, RunContext& ctx) override {
    Tensor out = Tensor::empty({p.size(0), p.size(1), p.size(2), v.size(3)}, p.dtype(), ctx.allocator);
    matmul_pv(p, v, out, ctx);
    return out;
  }

  void matmul_tn(const Tensor& a, const Tensor& b, Tensor& out, RunContext&) override {
    RecordFunction rf(op::matmul.name, dtypes_string({&a, &b}), dims_string(a) + ", " + dims_string(b));
    const std::int64_t B = a.size(0), H = a.size(1), S = a.size(2), M = a.size(3), N = b.size(3);
    const std::int64_t Hkv = out.size(1), group = H / Hkv;
    if (b.sizes() != Dims{B, H, S, N} || out.sizes() != Dims{B, Hkv, M, N} || H % Hkv != 0) {
      fail(ErrorKind::Internal, "matmul: " + a.describe() + "^T @ " + b.describe() + " into " + out.describe());
    }
    std::vector<float> as, bs, cs(static_cast<std::size_t>(M * N));
    for (std::int64_t bi = 0; bi < B; ++bi) {
      for (std::int64_t hk = 0; hk < Hkv; ++hk) {
        // The group's heads accumulate into one FP32 product, as the sum over
        // the expanded K/V heads does in autograd.
        for (std::int64_t g = 0; g < group; ++g) {
          std::int64_t lda = 0, ldb = 0;
          const float* ap = fp32_slice(a, bi, hk * group + g, as, lda);
          const float* bp = fp32_slice(b, bi, hk * group + g, bs, ldb);
          sgemm_tn(static_cast<int>(M), static_cast<int>(N), static_cast<int>(S), 1.0f, ap, static_cast<int>(lda), bp,
                   static_cast<int>(ldb), g == 0 ? 0.0f : 1.0f, cs.data(), static_cast<int>(N));
        }
        for (std::int64_t m = 0; m < M; ++m) store_row(out, bi, hk, m, cs.data() + m * N);
      }
    }
  }

  Tensor mul(const Tensor& x, float s, RunContext& ctx) override {
    RecordFunction rf(op::mul.name, dtypes_string({&x}) + ", Scalar", dims_string(x) + ", []");
    return map_rows(x, x.dtype(), ctx.allocator, [s](float* r, std::int64_t n, auto...) {
      for (std::int64_t j = 0; j < n; ++j) r[j] *= s;
    });
  }

  Tensor masked_fill(const Tensor& x, const Tensor& keep, float value, RunContext& ctx) override {
    RecordFunction rf(op::masked_fill.name, dtypes_string({&x, &keep}) + ", Scalar",
                      dims_string(x) + ", " + dims_string(keep) + ", []");
    Tensor y = Tensor::empty(x.sizes(), x.dtype(), ctx.allocator);
    {
      // The hidden copy of an out-of-place fill: clone the whole score tensor first.
      RecordFunction copy("copy_", dtypes_string({&y, &x}), dims_string(y) + ", " + dims_string(x));
      if (x.is_contiguous()) {
        std::memcpy(y.data(), x.data(), x.nbytes());
      } else {
        transform_rows(x, y, [](auto...) {});
      }
    }
    masked_fill_(y, keep, value, ctx);
    return y;
  }

  void masked_fill_(Tensor& x, const Tensor& keep_in, float value, RunContext&) override {
    RecordFunction rf(op::masked_fill_.name, dtypes_string({&x, &keep_in}) + ", Scalar",
                      dims_string(x) + ", " + dims_string(keep_in) + ", []");
    if (keep_in.dtype() != DType::Bool) {
      fail(ErrorKind::Internal, "masked_fill_ needs a bool mask, got " + keep_in.describe());
    }
    const Tensor keep = broadcast_to(keep_in, x, "masked_fill_");
    const auto* k = keep.data_as<const std::uint8_t>();
    update_rows(x, [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
      const std::uint8_t* kr = k + keep.index(b, h, i, 0);
      for (std::int64_t j = 0; j < n; ++j) {
        if (!kr[j * keep.stride(3)]) r[j] = value;
      }
    });
  }

  Tensor add(const Tensor& x, const Tensor& y_in, RunContext& ctx) override {
    RecordFunction rf(op::add.name, dtypes_string({&x, &y_in}), dims_string(x) + ", " + dims_string(y_in));
    const Tensor y = broadcast_to(y_in, x, "add");
    return map_rows(x, x.dtype(), ctx.allocator,
                    [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
                      for (std::int64_t j = 0; j < n; ++j) r[j] = masked_add(r[j], y.get(b, h, i, j));
                    });
  }

  void add_(Tensor& x, const Tensor& y_in, RunContext&) override {
    RecordFunction rf(op::add_.name, dtypes_string({&x, &y_in}), dims_string(x) + ", " + dims_string(y_in));
    const Tensor y = broadcast_to(y_in, x, "add_");
    update_rows(x, [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
      for (std::int64_t j = 0; j < n; ++j) r[j] = masked_add(r[j], y.get(b, h, i, j));
    });
  }

  Tensor softmax(const Tensor& x, RunContext& ctx) override {
    RecordFunction rf(op::softmax.name, dtypes_string({&x}), dims_string(x));
    return map_rows(x, x.dtype(), ctx.allocator, [](float* r, std::int64_t n, auto...) {
      float mx = kNegInf;
      for (std::int64_t j = 0; j < n; ++j) mx = std::max(mx, r[j]);
      float sum = 0;
      // exp(-inf - -inf) is NaN: a fully masked row comes out NaN, as in PyTorch.
      for (std::int64_t j = 0; j < n; ++j) sum += (r[j] = std::exp(r[j] - mx));
      const float inv = 1.0f / sum;
      for (std::int64_t j = 0; j < n; ++j) r[j] *= inv;
    });
  }

  Tensor safe_softmax(const Tensor& x, RunContext& ctx) override {
    RecordFunction rf(op::safe_softmax.name, dtypes_string({&x}), dims_string(x));
    return map_rows(x, x.dtype(), ctx.allocator, [](float* r, std::int64_t n, auto...) {
      float mx = kNegInf;
      bool nan = false;  // the max skips a NaN; the row is all -inf only without one
      for (std::int64_t j = 0; j < n; ++j) {
        mx = std::max(mx, r[j]);
        nan = nan || std::isnan(r[j]);
      }
      if (mx == kNegInf && !nan) {  // every key masked: zeros, not NaN (a NaN row stays NaN, as PyTorch's)
        for (std::int64_t j = 0; j < n; ++j) r[j] = 0;
        return;
      }
      float sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += (r[j] = std::exp(r[j] - mx));
      const float inv = 1.0f / sum;
      for (std::int64_t j = 0; j < n; ++j) r[j] *= inv;
    });
  }

  Tensor softmax_backward(const Tensor& grad, const Tensor& probs, RunContext& ctx) override {
    RecordFunction rf(op::softmax_backward.name, dtypes_string({&grad, &probs}),
                      dims_string(grad) + ", " + dims_string(probs));
    if (probs.sizes() != grad.sizes()) {
      fail(ErrorKind::Internal, "_softmax_backward_data: " + grad.describe() + " vs " + probs.describe());
    }
    return map_rows(grad, grad.dtype(), ctx.allocator,
                    [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
                      thread_local std::vector<float> p;
                      p.resize(static_cast<std::size_t>(n));
                      load_row(probs, b, h, i, p.data());
                      float dot = 0;
                      for (std::int64_t j = 0; j < n; ++j) dot += r[j] * p[j];
                      for (std::int64_t j = 0; j < n; ++j) r[j] = p[j] * (r[j] - dot);
                    });
  }

  Tensor tanh(const Tensor& x, RunContext& ctx) override {
    RecordFunction rf(op::tanh.name, dtypes_string({&x}), dims_string(x));
    return map_rows(x, x.dtype(), ctx.allocator, [](float* r, std::int64_t n, auto...) {
      for (std::int64_t j = 0; j < n; ++j) r[j] = std::tanh(r[j]);
    });
  }

  Tensor tanh_backward(const Tensor& grad, const Tensor& t, RunContext& ctx) override {
    RecordFunction rf(op::tanh_backward.name, dtypes_string({&grad, &t}), dims_string(grad) + ", " + dims_string(t));
    if (t.sizes() != grad.sizes())
      fail(ErrorKind::Internal, "tanh_backward: " + grad.describe() + " vs " + t.describe());
    return map_rows(grad, grad.dtype(), ctx.allocator,
                    [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
                      thread_local std::vector<float> tr;
                      tr.resize(static_cast<std::size_t>(n));
                      load_row(t, b, h, i, tr.data());
                      for (std::int64_t j = 0; j < n; ++j) r[j] *= 1.0f - tr[j] * tr[j];
                    });
  }

  Tensor dequantize(const Tensor& x, float descale, RunContext& ctx) override {
    RecordFunction rf(op::dequantize.name, dtypes_string({&x}) + ", Scalar", dims_string(x) + ", []");
    if (x.dtype() != DType::F8E4M3) fail(ErrorKind::Internal, "dequantize takes e4m3 tensors, got " + x.describe());
    // e4m3 widens exactly; the product is FP32's one rounding.
    return map_rows(x, DType::F32, ctx.allocator, [descale](float* r, std::int64_t n, auto...) {
      for (std::int64_t j = 0; j < n; ++j) r[j] *= descale;
    });
  }

  Tensor to(const Tensor& x, DType t, RunContext& ctx) override {
    RecordFunction rf(op::to.name, dtypes_string({&x}), dims_string(x));
    return map_rows(x, t, ctx.allocator, [](auto...) {});
  }

  void to_into(const Tensor& x, Tensor& out, RunContext&) override {
    RecordFunction rf(op::to.name, dtypes_string({&x}), dims_string(x));
    transform_rows(x, out, [](auto...) {});
  }

  Tensor ones(const Dims& sizes, RunContext& ctx) override {
    RecordFunction rf(op::ones.name, "", dims_string(sizes));
    Tensor m = Tensor::empty(sizes, DType::Bool, ctx.allocator);
    std::memset(m.data(), 1, m.nbytes());
    return m;
  }

  Tensor tril(const Tensor& x, std::int64_t diagonal, RunContext& ctx) override {
    return triangle(op::tril, x, diagonal, false, ctx.allocator);
  }

  Tensor triu(const Tensor& x, std::int64_t diagonal, RunContext& ctx) override {
    return triangle(op::triu, x, diagonal, true, ctx.allocator);
  }

  Tensor where(const Tensor& cond, float if_true, float if_false, RunContext& ctx) override {
    RecordFunction rf(op::where.name, "bool, Scalar, Scalar", dims_string(cond) + ", [], []");
    if (cond.dtype() != DType::Bool) fail(ErrorKind::Internal, "where needs a bool condition, got " + cond.describe());
    // Broadcast dims stay size 1: an expanded [S, Skv] mask gives an [S, Skv]
    // additive mask, not a [B, H, S, Skv] one.
    Dims sizes = cond.sizes();
    for (int d = 0; d < 4; ++d) {
      if (cond.stride(d) == 0) sizes[static_cast<std::size_t>(d)] = 1;
    }
    Tensor y = Tensor::empty(sizes, DType::F32, ctx.allocator);
    const auto* c = cond.data_as<const std::uint8_t>();
    auto* out = y.data_as<float>();
    const std::int64_t R = sizes[2], C = sizes[3], H = sizes[1], rows = sizes[0] * H * R;
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = r % R, h = (r / R) % H, b = r / (H * R);
      for (std::int64_t j = 0; j < C; ++j) out[r * C + j] = c[cond.index(b, h, i, j)] ? if_true : if_false;
    }
    return y;
  }

  Tensor structural_mask(const Problem& p, RunContext& ctx) override {
    RecordFunction rf(op::structural_mask.name);
    Tensor m = Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, ctx.allocator);
    auto* bits = m.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < p.seq; ++i) {
      for (std::int64_t j = 0; j < p.kv_seq; ++j) bits[i * p.kv_seq + j] = p.visible(i, j);
    }
    return m;
  }

  Tensor gather_pages(const Tensor& pages, const Tensor& table, std::int64_t kv_seq, RunContext& ctx) override {
    RecordFunction rf(op::gather_pages.name, dtypes_string({&pages, &table}),
                      dims_string(pages) + ", " + dims_string(table));
    const std::int64_t B = table.size(2), H = pages.size(1), page = pages.size(2), D = pages.size(3);
    if (table.dtype() != DType::I32 || !pages.is_contiguous()) {
      fail(ErrorKind::Internal, "index_select: want contiguous pages and an int32 table, got " + pages.describe() +
                                    " and " + table.describe());
    }
    Tensor out = Tensor::empty({B, H, kv_seq, D}, pages.dtype(), ctx.allocator);
    const std::size_t es = element_size(pages.dtype()), row = static_cast<std::size_t>(D) * es;
    const auto* src = static_cast<const unsigned char*>(pages.data());
    auto* dst = static_cast<unsigned char*>(out.data());
    const auto* ids = static_cast<const std::int32_t*>(table.data());
    // Every entry a physical page before any is read (make_inputs checks the
    // whole table with check_block_table; this guards the reads).
    const std::int64_t num_pages = pages.size(0), per_seq = (kv_seq + page - 1) / page;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t l = 0; l < per_seq; ++l) {
        const std::int64_t id = ids[b * table.stride(2) + l * table.stride(3)];
        if (id < 0 || id >= num_pages) {
          fail(ErrorKind::InvalidArgument, "block table [" + std::to_string(b) + "][" + std::to_string(l) +
                                               "] = " + std::to_string(id) + " is not a physical page (the cache has " +
                                               std::to_string(num_pages) + ")");
        }
      }
    }
    const std::int64_t n = B * H * kv_seq;
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t b = r / (H * kv_seq), h = (r / kv_seq) % H, j = r % kv_seq;
      const std::int64_t phys = ids[b * table.stride(2) + (j / page) * table.stride(3)];
      std::memcpy(dst + static_cast<std::size_t>(out.index(b, h, j, 0)) * es,
                  src + static_cast<std::size_t>(pages.index(phys, h, j % page, 0)) * es, row);
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<Ops> make_ops() { return std::make_unique<CpuOps>(); }

}  // namespace attnprof::cpu
