// The float64 reference, random inputs and the acceptance rule.
#include "attnprof/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/varlen.h"

namespace attnprof {
namespace {

// splitmix64: small, seedable, and good enough for test data.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }
};

Tensor random_tensor(const Dims& bhsd, DType dtype, Rng& rng, Allocator& allocator, bool bshd) {
  // In the [B, S, H, D] layout the buffer is allocated that way and viewed as [B, H, S, D].
  const Dims storage = bshd ? Dims{bhsd[0], bhsd[2], bhsd[1], bhsd[3]} : bhsd;
  Tensor t = Tensor::empty(storage, dtype, allocator);
  void* data = t.data();
  for (std::int64_t i = 0, n = t.numel(); i < n; ++i) {
    store_from_float(data, dtype, i, rng.uniform());
    // Never zeros, also after rounding: fp16 turns |v| < 2^-25 into zero.
    if (load_as_float(data, dtype, i) == 0.0f) store_from_float(data, dtype, i, 0.5f);
  }
  return bshd ? t.transpose(1, 2) : t;
}

// What a tensor's stored values are multiplied by to give the real ones: an
// e4m3 tensor's descale, 1 for every other dtype.
double real_factor(const Tensor& t, float descale) { return t.dtype() == DType::F8E4M3 ? descale : 1.0; }

// K and V of one (batch, kv head) widened to double (real values: e4m3 ones
// times their descales): sampled rows come sorted, so consecutive rows share them.
struct KvHead {
  std::int64_t b = -1, hk = -1, D = 0;
  std::vector<double> k, v;  // [Skv, D]

  // `tb`: b's batch index into the tensors of `in` (0 on one packed sequence's views).
  void load(const Problem& p, const Inputs& in, std::int64_t b_, std::int64_t hk_, std::int64_t tb) {
    if (b_ == b && hk_ == hk) return;
    b = b_;
    hk = hk_;
    D = p.head_dim;
    k.resize(static_cast<std::size_t>(p.kv_seq * D));
    v.resize(k.size());
    const double kf = real_factor(in.k, in.k_descale), vf = real_factor(in.v, in.v_descale);
    for (std::int64_t j = 0; j < p.kv_seq; ++j) {
      for (std::int64_t d = 0; d < D; ++d) {
        k[static_cast<std::size_t>(j * D + d)] = kf * in.k.get(tb, hk, j, d);
        v[static_cast<std::size_t>(j * D + d)] = vf * in.v.get(tb, hk, j, d);
      }
    }
  }
  const double* k_row(std::int64_t j) const { return k.data() + j * D; }
  const double* v_row(std::int64_t j) const { return v.data() + j * D; }
};

// One query row's softmax in float64: the probabilities over the keys (0 on
// masked ones) and its output. Returns false for a fully masked row, whose
// probabilities and output are zeros (the NaN-safe convention).
// With a soft cap c the scaled score s is c tanh(s / c) before the mask, and
// dcap holds its derivative 1 - tanh^2(s / c) for the gradient reference.
struct RowSoftmax {
  std::vector<double> q, prob, out, dcap;
  std::vector<char> keep;

  bool compute(const Problem& p, const Inputs& in, const KvHead& kv, std::int64_t b, std::int64_t h, std::int64_t i) {
    const std::int64_t D = p.head_dim, Skv = p.kv_seq;
    q.resize(static_cast<std::size_t>(D));
    prob.assign(static_cast<std::size_t>(Skv), 0.0);
    out.assign(static_cast<std::size_t>(D), 0.0);
    keep.resize(static_cast<std::size_t>(Skv));
    dcap.assign(static_cast<std::size_t>(Skv), 1.0);
    const double cap = p.softcap;
    const double qf = real_factor(in.q, in.q_descale);
    for (std::int64_t d = 0; d < D; ++d) q[static_cast<std::size_t>(d)] = qf * in.q.get(b, h, i, d);
    const double scale = p.softmax_scale();
    double mx = -std::numeric_limits<double>::infinity();
    bool any = false;
    for (std::int64_t j = 0; j < Skv; ++j) {
      bool vis = true;
      if (p.mask == MaskKind::Boolean) {
        vis = in.mask.get(b, h, i, j) != 0.0f;
      } else if (p.mask != MaskKind::Bias) {
        vis = p.visible(i, j);
      }
      keep[static_cast<std::size_t>(j)] = vis;
      if (!vis) continue;
      double s = 0;
      const double* kr = kv.k_row(j);
      for (std::int64_t d = 0; d < D; ++d) s += q[static_cast<std::size_t>(d)] * kr[d];
      s *= scale;
      if (cap > 0) {
        const double t = std::tanh(s / cap);
        s = cap * t;
        dcap[static_cast<std::size_t>(j)] = 1.0 - t * t;
      }
      if (p.mask == MaskKind::Bias) s += in.bias.get(b, h, i, j);
      prob[static_cast<std::size_t>(j)] = s;
      mx = std::max(mx, s);
      any = true;
    }
    if (!any) return false;
    double sum = 0;
    for (std::int64_t j = 0; j < Skv; ++j) {
      double& w = prob[static_cast<std::size_t>(j)];
      w = keep[static_cast<std::size_t>(j)] ? std::exp(w - mx) : 0.0;
      sum += w;
    }
    for (std::int64_t j = 0; j < Skv; ++j) {
      double& w = prob[static_cast<std::size_t>(j)];
      w /= sum;
      if (w == 0) continue;
      const double* vr = kv.v_row(j);
      for (std::int64_t d = 0; d < D; ++d) out[static_cast<std::size_t>(d)] += w * vr[d];
    }
    return true;
  }
};

// Accumulates one checked row of `got` (read through `at`) against `ref`.
class ErrorAccumulator {
 public:
  template <class At>
  void row(const std::vector<double>& ref, bool reference_defined, At at) {
    bool row_nan = false;
    double row_err2 = 0, row_ref2 = 0, row_max = 0;
    for (std::size_t d = 0; d < ref.size(); ++d) {
      const double o = at(static_cast<std::int64_t>(d));
      if (!std::isfinite(o)) {
        ++e_.nan_count;
        row_nan = true;
        continue;
      }
      const double diff = o - ref[d];
      row_err2 += diff * diff;
      row_ref2 += ref[d] * ref[d];
      row_max = std::max(row_max, std::abs(diff));
    }
    ++e_.rows_checked;
    if (row_nan) {
      ++e_.nan_rows;
      if (!reference_defined) ++e_.nan_rows_fully_masked;
      return;
    }
    err2_ += row_err2;
    ref2_ += row_ref2;
    e_.max_abs = std::max(e_.max_abs, row_max);
  }
  ErrorStats done() {
    e_.rel = ref2_ > 0 ? std::sqrt(err2_ / ref2_) : std::sqrt(err2_);
    return e_;
  }

 private:
  ErrorStats e_;
  double err2_ = 0, ref2_ = 0;
};

// Where (b, h, i) of the checked rows lives: for a dense problem the problem
// itself at batch index b; for a packed one sequence b as its own batch-1
// problem, on views of its rows (tensor batch index 0). Made once per b:
// sampled rows come sorted.
struct SequenceAt {
  std::int64_t b = -1;
  Problem p;
  Inputs in;
  std::int64_t tb = 0;  // batch index into the tensors of `in`

  void at(const Problem& whole, const Inputs& all, std::int64_t b_) {
    if (b_ == b) return;
    b = b_;
    p = whole.varlen() ? whole.sequence(b_) : whole;
    in = whole.varlen() ? sequence_inputs(whole, all, b_) : all;
    tb = whole.varlen() ? 0 : b_;
  }
};

// One query row's backward in float64, on top of its softmax: dO_i,
// dP_ij = dO_i . V_j and Delta_i = dO_i . O_i, then dS_ij = P_ij (dP_ij - Delta_i)
// (the softmax's backward), times 1 - tanh^2(s_ij / c) through a soft cap (the
// chain rule through c tanh(s / c)). One per thread.
struct RowBackward {
  RowSoftmax row;
  std::vector<double> dov, ds;

  // False for a fully masked row (no gradient flows through it).
  bool compute(const SequenceAt& seq, const KvHead& kv, const Tensor& d_out, std::int64_t h, std::int64_t i) {
    if (!row.compute(seq.p, seq.in, kv, seq.tb, h, i)) return false;
    const std::int64_t D = seq.p.head_dim, Skv = seq.p.kv_seq;
    dov.resize(static_cast<std::size_t>(D));
    ds.resize(static_cast<std::size_t>(Skv));
    double delta = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      dov[static_cast<std::size_t>(d)] = d_out.get(seq.tb, h, i, d);
      delta += dov[static_cast<std::size_t>(d)] * row.out[static_cast<std::size_t>(d)];
    }
    for (std::int64_t j = 0; j < Skv; ++j) {
      const double pij = row.prob[static_cast<std::size_t>(j)];
      double s = 0;
      if (pij != 0) {
        const double* vr = kv.v_row(j);
        for (std::int64_t d = 0; d < D; ++d) s += dov[static_cast<std::size_t>(d)] * vr[d];
      }
      ds[static_cast<std::size_t>(j)] = pij * (s - delta) * row.dcap[static_cast<std::size_t>(j)];
    }
    return true;
  }
};

// dV_j = sum_i P_ij dO_i and dK_j = scale sum_i dS_ij Q_i for the keys `js` of
// one (batch, kv head), over every query row of the `group` heads from
// `head0`: [js.size(), D] each. Every query row's softmax costs O(Skv D), so
// the rows are split over the machine's threads (a 2 x 16 x 8192 x 128 check
// took minutes on one), each summing its own partials, added in thread order.
void accumulate_kv_rows(const SequenceAt& seq, const KvHead& kv, const Tensor& d_out, std::int64_t head0,
                        std::int64_t group, const std::vector<std::int64_t>& js, double scale,
                        std::vector<double>& dk_ref, std::vector<double>& dv_ref) {
  const std::size_t D = static_cast<std::size_t>(seq.p.head_dim), n_out = js.size() * D;
  const std::int64_t rows = group * seq.p.seq;
  const std::int64_t workers = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::thread::hardware_concurrency()),
                                                        1, std::max<std::int64_t>(1, rows / 64));
  std::vector<std::vector<double>> dk_part(static_cast<std::size_t>(workers), std::vector<double>(n_out)),
      dv_part(dk_part);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
  const auto work = [&](std::int64_t w) {
    try {
      RowBackward rb;
      std::vector<double>& dk = dk_part[static_cast<std::size_t>(w)];
      std::vector<double>& dv = dv_part[static_cast<std::size_t>(w)];
      for (std::int64_t r = w; r < rows; r += workers) {  // interleaved: causal rows differ in cost
        const std::int64_t h = head0 + r / seq.p.seq, i = r % seq.p.seq;
        if (!rb.compute(seq, kv, d_out, h, i)) continue;
        for (std::size_t n = 0; n < js.size(); ++n) {
          const double pij = rb.row.prob[static_cast<std::size_t>(js[n])];
          const double ds = rb.ds[static_cast<std::size_t>(js[n])];
          if (pij == 0 && ds == 0) continue;
          for (std::size_t d = 0; d < D; ++d) {
            dv[n * D + d] += pij * rb.dov[d];
            dk[n * D + d] += scale * ds * rb.row.q[d];
          }
        }
      }
    } catch (...) {
      errors[static_cast<std::size_t>(w)] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (std::int64_t w = 1; w < workers; ++w) threads.emplace_back(work, w);
  work(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  dk_ref.assign(n_out, 0.0);
  dv_ref.assign(n_out, 0.0);
  for (std::int64_t w = 0; w < workers; ++w) {
    for (std::size_t x = 0; x < n_out; ++x) {
      dk_ref[x] += dk_part[static_cast<std::size_t>(w)][x];
      dv_ref[x] += dv_part[static_cast<std::size_t>(w)][x];
    }
  }
}

}  // namespace

namespace {

// The paged copies of in.k and in.v: B * pages_per_seq physical pages in a
// random order, the padding of each sequence's last page zeros.
void make_pages(const Problem& p, Rng& rng, Allocator& allocator, Inputs& in) {
  const std::int64_t page = p.page_size, per_seq = p.pages_per_seq(), num_pages = p.batch * per_seq;
  std::vector<std::int32_t> physical(static_cast<std::size_t>(num_pages));
  for (std::int64_t i = 0; i < num_pages; ++i) physical[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  for (std::int64_t i = num_pages - 1; i > 0; --i) {  // Fisher-Yates
    const auto j = static_cast<std::int64_t>(rng.next() % static_cast<std::uint64_t>(i + 1));
    std::swap(physical[static_cast<std::size_t>(i)], physical[static_cast<std::size_t>(j)]);
  }
  in.block_table = Tensor::empty({1, 1, p.batch, per_seq}, DType::I32, allocator);
  std::memcpy(in.block_table.data(), physical.data(), physical.size() * sizeof(std::int32_t));
  check_block_table(p, in.block_table, num_pages);
  const std::size_t row = static_cast<std::size_t>(p.head_dim) * element_size(p.dtype);
  const auto paged = [&](const Tensor& logical) {
    Tensor pages = Tensor::empty({num_pages, p.kv_heads, page, p.head_dim}, p.dtype, allocator);
    std::memset(pages.data(), 0, pages.nbytes());
    auto* dst = static_cast<unsigned char*>(pages.data());
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t hk = 0; hk < p.kv_heads; ++hk) {
        for (std::int64_t j = 0; j < p.kv_seq; ++j) {
          const std::int64_t phys = physical[static_cast<std::size_t>(b * per_seq + j / page)];
          unsigned char* to =
              dst + static_cast<std::size_t>(pages.index(phys, hk, j % page, 0)) * element_size(p.dtype);
          if (logical.stride(3) == 1) {
            std::memcpy(to,
                        static_cast<const unsigned char*>(logical.data()) +
                            static_cast<std::size_t>(logical.index(b, hk, j, 0)) * element_size(p.dtype),
                        row);
          } else {
            for (std::int64_t d = 0; d < p.head_dim; ++d) pages.set(phys, hk, j % page, d, logical.get(b, hk, j, d));
          }
        }
      }
    }
    return pages;
  };
  in.k_pages = paged(in.k);
  in.v_pages = paged(in.v);
}

// A fresh tensor of `dtype` laid out as `like`: its strides, over storage of
// their span (offset 0). make_inputs' tensors, contiguous or [B, S, H, D]
// storage viewed as [B, H, S, D], span exactly their elements.
Tensor empty_with_layout(const Tensor& like, DType dtype, Allocator& allocator) {
  std::int64_t span = like.numel() > 0 ? 1 : 0;
  for (int d = 0; d < 4 && span > 0; ++d) span += (like.size(d) - 1) * like.stride(d);
  return Tensor::empty({1, 1, 1, span}, dtype, allocator).as_strided(like.sizes(), like.strides(), 0);
}

// `real` into the e4m3 tensor `stored` (same sizes): stored = e4m3(real /
// descale), and what that cost.
Fp8TensorQuantization quantize_tensor(std::string name, const Tensor& real, std::optional<double> fixed,
                                      Tensor& stored) {
  Fp8TensorQuantization t{.name = std::move(name), .elements = real.numel()};
  const Dims& n = real.sizes();
  const auto each = [&](auto f) {
    for (std::int64_t a = 0; a < n[0]; ++a)
      for (std::int64_t b = 0; b < n[1]; ++b)
        for (std::int64_t c = 0; c < n[2]; ++c)
          for (std::int64_t d = 0; d < n[3]; ++d) f(a, b, c, d);
  };
  each([&](auto a, auto b, auto c, auto d) { t.amax = std::max(t.amax, std::abs(double{real.get(a, b, c, d)})); });
  t.descale = fixed ? *fixed : auto_fp8_descale(t.amax);
  const double limit = max_finite(DType::F8E4M3);
  auto* out = static_cast<std::uint8_t*>(stored.data());
  each([&](auto a, auto b, auto c, auto d) {
    const double x = real.get(a, b, c, d) / t.descale;
    t.saturated += std::abs(x) > limit;
    out[stored.index(a, b, c, d)] = float_to_e4m3(static_cast<float>(x));
  });
  return t;
}

}  // namespace

Problem fp8_real_problem(const Problem& p) {
  Problem r = p;
  if (is_fp8(p.dtype)) r.dtype = DType::BF16;
  return r;
}

double auto_fp8_descale(double amax) { return amax > 0 ? amax / max_finite(DType::F8E4M3) : 1.0; }

void check_fp8_descale(std::string_view field, double descale) {
  if (std::isfinite(descale) && descale > 0) return;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", descale);
  fail(ErrorKind::InvalidArgument,
       std::string(field) + " must be a finite positive number (the factor e4m3 values are multiplied by), got " + buf,
       {std::string(field)});
}

Fp8Quantized quantize_inputs(const Problem& p, const Inputs& real, std::optional<double> fixed, Allocator& allocator) {
  if (fixed) check_fp8_descale("fp8_descale", *fixed);
  Fp8Quantized r;
  r.in = real;  // the mask, bias, block table and key counts as they are
  const auto quantize = [&](const char* name, const Tensor& x, Tensor& into, float& descale) {
    into = empty_with_layout(x, DType::F8E4M3, allocator);
    r.tensors.push_back(quantize_tensor(name, x, fixed, into));
    descale = static_cast<float>(r.tensors.back().descale);
  };
  quantize("q", real.q, r.in.q, r.in.q_descale);
  quantize("k", real.k, r.in.k, r.in.k_descale);
  quantize("v", real.v, r.in.v, r.in.v_descale);
  if (p.kv_cache == KvCache::Paged) {
    // The pages hold K's and V's values (and zero padding): their tensor's descale.
    for (auto [pages, into, descale] : {std::tuple{&real.k_pages, &r.in.k_pages, r.in.k_descale},
                                        std::tuple{&real.v_pages, &r.in.v_pages, r.in.v_descale}}) {
      *into = empty_with_layout(*pages, DType::F8E4M3, allocator);
      (void)quantize_tensor("pages", *pages, descale, *into);
    }
  }
  return r;
}

Inputs make_inputs(const Problem& p, std::uint64_t seed, Allocator& allocator, bool bshd) {
  if (is_fp8(p.dtype)) {
    return quantize_inputs(p, make_inputs(fp8_real_problem(p), seed, allocator, bshd), std::nullopt, allocator).in;
  }
  Rng rng{seed * 0x2545f4914f6cdd1dull + 1};
  Inputs in;
  // A packed batch is laid out as FlashAttention's varlen functions take it,
  // [total, H, D]: the [1, total, H, D] storage of the bshd layout.
  bshd = bshd || p.varlen();
  in.q = random_tensor(p.q_dims(), p.dtype, rng, allocator, bshd);
  in.k = random_tensor(p.kv_dims(), p.dtype, rng, allocator, bshd);
  in.v = random_tensor(p.kv_dims(), p.dtype, rng, allocator, bshd);
  if (p.mask == MaskKind::Boolean) {
    // One [S, Skv] mask broadcast over batch and heads: 90% of keys kept, and
    // the diagonal always kept so no row is masked by accident.
    Tensor m = Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, allocator);
    auto* bits = m.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < p.seq; ++i) {
      for (std::int64_t j = 0; j < p.kv_seq; ++j) {
        bits[i * p.kv_seq + j] = (rng.next() % 10 != 0) || j == std::min(i, p.kv_seq - 1);
      }
    }
    attach_mask(p, m, in, "the generated mask");
  } else if (p.mask == MaskKind::Bias) {
    Tensor b = Tensor::empty({1, 1, p.seq, p.kv_seq}, p.dtype, allocator);
    for (std::int64_t i = 0, n = b.numel(); i < n; ++i) store_from_float(b.data(), p.dtype, i, 2.0f * rng.uniform());
    attach_mask(p, b, in, "the generated bias");
  }
  if (p.kv_cache == KvCache::Paged) make_pages(p, rng, allocator, in);
  return in;
}

void check_block_table(const Problem& p, const Tensor& block_table, std::int64_t num_pages) {
  const std::int64_t pages = p.pages_per_seq();
  if (!block_table.defined() || block_table.dtype() != DType::I32 || block_table.size(0) != 1 ||
      block_table.size(1) != 1 || block_table.size(2) != p.batch || block_table.size(3) != pages) {
    fail(ErrorKind::InvalidArgument, "block table: want int32 [" + std::to_string(p.batch) + ", " +
                                         std::to_string(pages) + "] (batch, pages per sequence), got " +
                                         (block_table.defined() ? block_table.describe() : std::string("none")));
  }
  std::vector<std::int64_t> owner(static_cast<std::size_t>(std::max<std::int64_t>(num_pages, 0)), -1);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t l = 0; l < pages; ++l) {
      const auto page = static_cast<std::int64_t>(block_table.get(0, 0, b, l));
      const std::string slot =
          "block table [" + std::to_string(b) + "][" + std::to_string(l) + "] = " + std::to_string(page);
      if (page < 0 || page >= num_pages) {
        fail(ErrorKind::InvalidArgument, slot + " is not a physical page (the cache has " + std::to_string(num_pages) +
                                             ", 0 .. " + std::to_string(num_pages - 1) + ")");
      }
      std::int64_t& o = owner[static_cast<std::size_t>(page)];
      if (o >= 0) {
        fail(ErrorKind::InvalidArgument, slot + ": physical page " + std::to_string(page) + " is already sequence " +
                                             std::to_string(o / pages) + "'s logical page " +
                                             std::to_string(o % pages) + " (a page serves one slot)");
      }
      o = b * pages + l;
    }
  }
}

void check_block_table_reads(const Problem& p, const Tensor& block_table, std::int64_t num_pages,
                             const std::int32_t* kv_lens) {
  const std::int64_t pages = p.pages_per_seq();
  if (!block_table.defined() || block_table.dtype() != DType::I32 || block_table.device() != Device::Cpu ||
      block_table.size(0) != 1 || block_table.size(1) != 1 || block_table.size(2) != p.batch ||
      block_table.size(3) < pages) {
    fail(ErrorKind::InvalidArgument, "block_table: want int32 [" + std::to_string(p.batch) +
                                         ", >= " + std::to_string(pages) + "] (batch, pages per sequence), got " +
                                         (block_table.defined() ? block_table.describe() : std::string("none")));
  }
  const auto* ids = block_table.data_as<const std::int32_t>();
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t keys = kv_lens ? kv_lens[b] : p.kv_seq;
    const std::int64_t used = (keys + p.page_size - 1) / p.page_size;
    for (std::int64_t l = 0; l < used; ++l) {
      const std::int64_t page = ids[b * block_table.stride(2) + l * block_table.stride(3)];
      if (page < 0 || page >= num_pages) {
        fail(ErrorKind::InvalidArgument, "block table [" + std::to_string(b) + "][" + std::to_string(l) +
                                             "] = " + std::to_string(page) + " is not a physical page (the cache has " +
                                             std::to_string(num_pages) + ", 0 .. " + std::to_string(num_pages - 1) +
                                             ")");
      }
    }
  }
}

RowSample sample_rows(const Problem& p, std::int64_t max_rows) {
  RowSample s;
  const std::int64_t total = p.heads * p.total_q();
  if (total <= max_rows) {
    s.rows.reserve(static_cast<std::size_t>(total));
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t i = 0; i < p.seq_len(b); ++i) s.rows.push_back((b * p.heads + h) * p.seq + i);
      }
    }
    return s;
  }
  // Whole heads are too many: take rows spread evenly over every (batch, head),
  // always including each head's first and last rows (the causal edges).
  const std::int64_t heads_total = p.batch * p.heads;
  const std::int64_t per_head = std::max<std::int64_t>(2, max_rows / heads_total);
  const std::int64_t head_step = std::max<std::int64_t>(1, heads_total * per_head / max_rows);
  for (std::int64_t bh = 0; bh < heads_total; bh += head_step) {
    const std::int64_t len = p.seq_len(bh / p.heads);
    if (len == 0) continue;
    for (std::int64_t k = 0; k < per_head; ++k) {
      const std::int64_t i = per_head == 1 ? 0 : k * (len - 1) / (per_head - 1);
      s.rows.push_back(bh * p.seq + i);
    }
  }
  s.rows.erase(std::unique(s.rows.begin(), s.rows.end()), s.rows.end());
  return s;
}

ErrorStats check_against_reference(const Problem& p, const Inputs& in, const Tensor& out, const RowSample& rows) {
  if (out.device() != Device::Cpu) fail(ErrorKind::Internal, "reference check needs a CPU output");
  KvHead kv;
  RowSoftmax row;
  ErrorAccumulator acc;
  SequenceAt seq;
  Tensor o;
  for (const std::int64_t r : rows.rows) {
    const std::int64_t b = r / (p.heads * p.seq), h = (r / p.seq) % p.heads, i = r % p.seq;
    if (b != seq.b) o = p.varlen() ? sequence_q_rows(p, out, b) : out;
    seq.at(p, in, b);
    kv.load(seq.p, seq.in, b, h / p.group(), seq.tb);
    const bool any = row.compute(seq.p, seq.in, kv, seq.tb, h, i);
    acc.row(row.out, any, [&](std::int64_t d) { return static_cast<double>(o.get(seq.tb, h, i, d)); });
  }
  return acc.done();
}

Tensor make_dout(const Problem& p, std::uint64_t seed, Allocator& allocator) {
  Rng rng{seed * 0x9e3779b97f4a7c15ull + 7};
  return random_tensor(p.q_dims(), output_dtype(p.dtype), rng, allocator, false);
}

RowSample sample_kv_rows(const Problem& p, std::int64_t max_rows) {
  RowSample s;
  const std::int64_t pairs = p.batch * p.kv_heads;
  if (p.kv_heads * p.total_kv() <= max_rows) {
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      for (std::int64_t j = 0; j < p.kv_seq_len(pair / p.kv_heads); ++j) s.rows.push_back(pair * p.kv_seq + j);
    }
    return s;
  }
  // The first, a middle and the last (batch, kv head) pair: each costs a pass
  // over every query row of its group.
  std::vector<std::int64_t> chosen = {0, pairs / 2, pairs - 1};
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  for (const std::int64_t pair : chosen) {
    const std::int64_t len = p.kv_seq_len(pair / p.kv_heads);
    if (len == 0) continue;
    const std::int64_t per_pair = std::clamp<std::int64_t>(max_rows / static_cast<std::int64_t>(chosen.size()), 2,
                                                           std::max<std::int64_t>(len, 2));
    for (std::int64_t k = 0; k < per_pair; ++k) {
      s.rows.push_back(pair * p.kv_seq + (per_pair == 1 ? 0 : k * (len - 1) / (per_pair - 1)));
    }
  }
  s.rows.erase(std::unique(s.rows.begin(), s.rows.end()), s.rows.end());
  return s;
}

GradientErrors check_gradients_against_reference(const Problem& p, const Inputs& in, const Tensor& dout,
                                                 const Gradients& g, const RowSample& q_rows,
                                                 const RowSample& kv_rows) {
  for (const Tensor* t : {&dout, &g.dq, &g.dk, &g.dv}) {
    if (t->device() != Device::Cpu) fail(ErrorKind::Internal, "gradient check needs CPU tensors");
  }
  const std::int64_t D = p.head_dim;
  const double scale = p.softmax_scale();
  KvHead kv;
  SequenceAt seq;  // the row's sequence: p itself when dense
  // A packed batch's dO and gradients, viewed at the current sequence's rows.
  Tensor d_out, dq_t, dk_t, dv_t;
  const auto at = [&](std::int64_t b) {
    if (b == seq.b) return;
    seq.at(p, in, b);
    d_out = p.varlen() ? sequence_q_rows(p, dout, b) : dout;
    dq_t = p.varlen() ? sequence_q_rows(p, g.dq, b) : g.dq;
    dk_t = p.varlen() ? sequence_kv_rows(p, g.dk, b) : g.dk;
    dv_t = p.varlen() ? sequence_kv_rows(p, g.dv, b) : g.dv;
  };
  RowBackward rb;
  GradientErrors out;
  // dQ_i = scale sum_j dS_ij K_j: one query row at a time.
  ErrorAccumulator dq;
  std::vector<double> ref(static_cast<std::size_t>(D));
  for (const std::int64_t r : q_rows.rows) {
    const std::int64_t b = r / (p.heads * p.seq), h = (r / p.seq) % p.heads, i = r % p.seq;
    at(b);
    kv.load(seq.p, seq.in, b, h / p.group(), seq.tb);
    std::fill(ref.begin(), ref.end(), 0.0);
    if (rb.compute(seq, kv, d_out, h, i)) {
      for (std::int64_t j = 0; j < seq.p.kv_seq; ++j) {
        const double ds = rb.ds[static_cast<std::size_t>(j)];
        if (ds == 0) continue;
        const double* kr = kv.k_row(j);
        for (std::int64_t d = 0; d < D; ++d) ref[static_cast<std::size_t>(d)] += scale * ds * kr[d];
      }
    }
    dq.row(ref, true, [&](std::int64_t d) { return static_cast<double>(dq_t.get(seq.tb, h, i, d)); });
  }
  out.dq = dq.done();

  // dV_j = sum_i P_ij dO_i and dK_j = scale sum_i dS_ij Q_i over every query
  // row of every head in the group: one pass per (batch, kv head) pair.
  ErrorAccumulator dk, dv;
  const std::int64_t Skv = p.kv_seq;  // the rows' flattening (the maximum for a packed batch)
  std::size_t next = 0;
  while (next < kv_rows.rows.size()) {
    const std::int64_t pair = kv_rows.rows[next] / Skv;
    std::vector<std::int64_t> js;
    for (; next < kv_rows.rows.size() && kv_rows.rows[next] / Skv == pair; ++next) {
      js.push_back(kv_rows.rows[next] % Skv);
    }
    const std::int64_t b = pair / p.kv_heads, hk = pair % p.kv_heads;
    at(b);
    kv.load(seq.p, seq.in, b, hk, seq.tb);
    std::vector<double> dk_ref, dv_ref;
    accumulate_kv_rows(seq, kv, d_out, hk * p.group(), p.group(), js, scale, dk_ref, dv_ref);
    for (std::size_t n = 0; n < js.size(); ++n) {
      const std::int64_t j = js[n];
      const auto slice = [&](const std::vector<double>& all) {
        return std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(D)),
                                   all.begin() + static_cast<std::ptrdiff_t>((n + 1) * static_cast<std::size_t>(D)));
      };
      dk.row(slice(dk_ref), true, [&](std::int64_t d) { return static_cast<double>(dk_t.get(seq.tb, hk, j, d)); });
      dv.row(slice(dv_ref), true, [&](std::int64_t d) { return static_cast<double>(dv_t.get(seq.tb, hk, j, d)); });
    }
  }
  out.dk = dk.done();
  out.dv = dv.done();
  return out;
}

double tolerance_floor(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 2e-5;  // "far under 1e-4"
    case DType::F16:
      return 1e-3;
    case DType::BF16:
      return 5e-3;
    case DType::F8E4M3:
      // e4m3 keeps 3 mantissa bits: its unit roundoff (half the relative
      // step at the top of a binade) is 2^-4. Rounding errors spread
      // uniformly over +-u have an RMS of u / sqrt(3), the most one rounding
      // of every element can add to a relative (RMS) error: 3.6e-2. The
      // floor allows a backend one such rounding beyond what math pays for
      // the inputs (P quantized to e4m3 for P V, as FlashAttention-3
      // and cuDNN's FP8 graphs do), and the bf16 output's 2^-8 is inside it.
      return 0x1p-4 / std::sqrt(3.0);
    default:
      return 0;
  }
}

Acceptance accept(DType dtype, const ErrorStats& e, std::optional<double> math_rel, bool nan_allowed_on_masked_rows) {
  Acceptance a;
  char buf[160];
  if (e.nan_rows > 0) {
    const bool documented = nan_allowed_on_masked_rows && e.nan_rows == e.nan_rows_fully_masked;
    if (!documented) {
      std::snprintf(buf, sizeof buf, "NaN in %lld checked rows", static_cast<long long>(e.nan_rows));
      a.why = buf;
      return a;
    }
  }
  const double floor = tolerance_floor(dtype);
  a.tolerance = (dtype == DType::F32 || !math_rel) ? (dtype == DType::F32 ? floor : 2 * floor) : 2 * *math_rel + floor;
  a.pass = e.rel <= a.tolerance;
  if (dtype != DType::F32 && math_rel) {
    std::snprintf(buf, sizeof buf,
                  is_fp8(dtype) ? "rel %.2e %s 2 x %.2e (math) + %.1e" : "rel %.2e %s 2 x %.2e (math) + %.0e", e.rel,
                  a.pass ? "<=" : ">", *math_rel, floor);
  } else {
    std::snprintf(buf, sizeof buf, "rel %.2e %s %.1e", e.rel, a.pass ? "<=" : ">", a.tolerance);
  }
  a.why = buf;
  if (e.nan_rows > 0) a.why += " (NaN on fully masked rows, as documented)";
  return a;
}

}  // namespace attnprof
