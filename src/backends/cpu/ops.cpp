#include "backends/cpu/ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "backends/cpu/blas.h"

namespace attnprof::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
  const std::int64_t C = t.size(3), cs = t.stride(3), base = t.index(b, h, i, 0);
  const void* data = t.data();
  if (t.dtype() == DType::F32 && cs == 1) {
    std::memcpy(dst, static_cast<const float*>(data) + base, static_cast<std::size_t>(C) * sizeof(float));
    return;
  }
  for (std::int64_t j = 0; j < C; ++j) dst[j] = load_as_float(data, t.dtype(), base + j * cs);
}

void store_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, const float* src) {
  const std::int64_t C = t.size(3), cs = t.stride(3), base = t.index(b, h, i, 0);
  void* data = t.data();
  if (t.dtype() == DType::F32 && cs == 1) {
    std::memcpy(static_cast<float*>(data) + base, src, static_cast<std::size_t>(C) * sizeof(float));
    return;
  }
  for (std::int64_t j = 0; j < C; ++j) store_from_float(data, t.dtype(), base + j * cs, src[j]);
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

void check_same_rows(const Tensor& x, const Tensor& m, const char* op) {
  if (x.size(2) != m.size(2) || x.size(3) != m.size(3)) {
    fail(ErrorKind::InvalidArgument,
         std::string(op) + ": mask " + m.describe() + " does not fit scores " + x.describe());
  }
}

}  // namespace

std::string dims_string(const Tensor& t) { return t.dims_string(); }

std::string dtypes_string(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) {
    if (!s.empty()) s += ", ";
    s += dtype_name(t->dtype());
  }
  return s;
}

Tensor matmul_qk(const Tensor& q, const Tensor& k, DType out, Allocator& a) {
  RecordFunction rf("matmul", dtypes_string({&q, &k}), dims_string(q) + ", " + dims_string(k));
  const std::int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3), Skv = k.size(2);
  const std::int64_t group = H / k.size(1);
  Tensor s = Tensor::empty({B, H, S, Skv}, out, a);
  std::vector<float> qs, ks, cs;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      std::int64_t ldq = 0, ldk = 0;
      const float* qp = fp32_slice(q, b, h, qs, ldq);
      const float* kp = fp32_slice(k, b, h / group, ks, ldk);
      float* c = nullptr;
      if (out == DType::F32) {
        c = s.data_as<float>() + s.index(b, h, 0, 0);
      } else {
        cs.resize(static_cast<std::size_t>(S * Skv));
        c = cs.data();
      }
      sgemm(true, static_cast<int>(S), static_cast<int>(Skv), static_cast<int>(D), 1.0f, qp, static_cast<int>(ldq), kp,
            static_cast<int>(ldk), 0.0f, c, static_cast<int>(Skv));
      if (out != DType::F32) {
        for (std::int64_t i = 0; i < S; ++i) store_row(s, b, h, i, c + i * Skv);
      }
    }
  }
  return s;
}

void matmul_pv(const Tensor& p, const Tensor& v, Tensor& out) {
  RecordFunction rf("matmul", dtypes_string({&p, &v}), dims_string(p) + ", " + dims_string(v));
  const std::int64_t B = p.size(0), H = p.size(1), S = p.size(2), Skv = p.size(3), D = v.size(3);
  const std::int64_t group = H / v.size(1);
  std::vector<float> ps, vs, cs(static_cast<std::size_t>(S * D));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      std::int64_t ldp = 0, ldv = 0;
      const float* pp = fp32_slice(p, b, h, ps, ldp);
      const float* vp = fp32_slice(v, b, h / group, vs, ldv);
      sgemm(false, static_cast<int>(S), static_cast<int>(D), static_cast<int>(Skv), 1.0f, pp, static_cast<int>(ldp), vp,
            static_cast<int>(ldv), 0.0f, cs.data(), static_cast<int>(D));
      for (std::int64_t i = 0; i < S; ++i) store_row(out, b, h, i, cs.data() + i * D);
    }
  }
}

Tensor mul(const Tensor& x, float s, Allocator& a) {
  RecordFunction rf("mul", dtypes_string({&x}), dims_string(x));
  return map_rows(x, x.dtype(), a, [s](float* r, std::int64_t n, auto...) {
    for (std::int64_t j = 0; j < n; ++j) r[j] *= s;
  });
}

void masked_fill_(Tensor& x, const Tensor& masked, float value) {
  RecordFunction rf("masked_fill_", dtypes_string({&x, &masked}), dims_string(x) + ", " + dims_string(masked));
  check_same_rows(x, masked, "masked_fill_");
  const auto* m = masked.data_as<const std::uint8_t>();
  update_rows(x, [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
    const std::uint8_t* mr = m + masked.index(b, h, i, 0);
    for (std::int64_t j = 0; j < n; ++j) {
      if (mr[j * masked.stride(3)]) r[j] = value;
    }
  });
}

Tensor masked_fill(const Tensor& x, const Tensor& masked, float value, Allocator& a) {
  RecordFunction rf("masked_fill", dtypes_string({&x, &masked}), dims_string(x) + ", " + dims_string(masked));
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), a);
  {
    // The hidden copy of an out-of-place fill: clone the whole score tensor first.
    RecordFunction copy("copy_", dtypes_string({&y, &x}), dims_string(y) + ", " + dims_string(x));
    if (x.is_contiguous()) {
      std::memcpy(y.data(), x.data(), x.nbytes());
    } else {
      transform_rows(x, y, [](auto...) {});
    }
  }
  masked_fill_(y, masked, value);
  return y;
}

Tensor add(const Tensor& x, const Tensor& y, Allocator& a) {
  RecordFunction rf("add", dtypes_string({&x, &y}), dims_string(x) + ", " + dims_string(y));
  check_same_rows(x, y, "add");
  return map_rows(x, x.dtype(), a, [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
    for (std::int64_t j = 0; j < n; ++j) r[j] += y.get(b, h, i, j);
  });
}

void add_(Tensor& x, const Tensor& y) {
  RecordFunction rf("add_", dtypes_string({&x, &y}), dims_string(x) + ", " + dims_string(y));
  check_same_rows(x, y, "add_");
  update_rows(x, [&](float* r, std::int64_t n, std::int64_t b, std::int64_t h, std::int64_t i) {
    for (std::int64_t j = 0; j < n; ++j) r[j] += y.get(b, h, i, j);
  });
}

Tensor softmax(const Tensor& x, Allocator& a) {
  RecordFunction rf("softmax", dtypes_string({&x}), dims_string(x));
  return map_rows(x, x.dtype(), a, [](float* r, std::int64_t n, auto...) {
    float mx = kNegInf;
    for (std::int64_t j = 0; j < n; ++j) mx = std::max(mx, r[j]);
    float sum = 0;
    // exp(-inf - -inf) is NaN: a fully masked row comes out NaN, as in PyTorch.
    for (std::int64_t j = 0; j < n; ++j) sum += (r[j] = std::exp(r[j] - mx));
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < n; ++j) r[j] *= inv;
  });
}

Tensor safe_softmax(const Tensor& x, Allocator& a) {
  RecordFunction rf("_safe_softmax", dtypes_string({&x}), dims_string(x));
  return map_rows(x, x.dtype(), a, [](float* r, std::int64_t n, auto...) {
    float mx = kNegInf;
    for (std::int64_t j = 0; j < n; ++j) mx = std::max(mx, r[j]);
    if (mx == kNegInf) {  // every key masked: zeros, not NaN
      for (std::int64_t j = 0; j < n; ++j) r[j] = 0;
      return;
    }
    float sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += (r[j] = std::exp(r[j] - mx));
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < n; ++j) r[j] *= inv;
  });
}

Tensor to(const Tensor& x, DType t, Allocator& a) {
  RecordFunction rf("to", dtypes_string({&x}), dims_string(x));
  return map_rows(x, t, a, [](auto...) {});
}

void to_into(const Tensor& x, Tensor& out) {
  RecordFunction rf("to", dtypes_string({&x}), dims_string(x));
  transform_rows(x, out, [](auto...) {});
}

Tensor logical_not(const Tensor& m, Allocator& a) {
  RecordFunction rf("logical_not", dtypes_string({&m}), dims_string(m));
  return map_rows(m, DType::Bool, a, [](float* r, std::int64_t n, auto...) {
    for (std::int64_t j = 0; j < n; ++j) r[j] = r[j] == 0.0f ? 1.0f : 0.0f;
  });
}

Tensor ones_bool(std::int64_t rows, std::int64_t cols, Allocator& a) {
  Tensor m = Tensor::empty({1, 1, rows, cols}, DType::Bool, a);
  RecordFunction rf("ones", "bool", dims_string(m));
  std::memset(m.data(), 1, m.nbytes());
  return m;
}

void tril_(Tensor& m, const Problem& p) {
  RecordFunction rf("tril", "bool", dims_string(m));
  auto* bits = m.data_as<std::uint8_t>();
  const std::int64_t C = m.size(3);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < m.size(2); ++i) {
    for (std::int64_t j = 0; j < C; ++j) bits[i * C + j] = bits[i * C + j] && p.visible(i, j);
  }
}

Tensor where_additive(const Tensor& keep, Allocator& a) {
  RecordFunction rf("where", "bool", dims_string(keep));
  return map_rows(keep, DType::F32, a, [](float* r, std::int64_t n, auto...) {
    for (std::int64_t j = 0; j < n; ++j) r[j] = r[j] != 0.0f ? 0.0f : kNegInf;
  });
}

Tensor structural_masked(const Problem& p, Allocator& a) {
  Tensor m = Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, a);
  auto* bits = m.data_as<std::uint8_t>();
  for (std::int64_t i = 0; i < p.seq; ++i) {
    for (std::int64_t j = 0; j < p.kv_seq; ++j) bits[i * p.kv_seq + j] = !p.visible(i, j);
  }
  return m.expand({p.batch, p.heads, p.seq, p.kv_seq});
}

}  // namespace attnprof::cpu
