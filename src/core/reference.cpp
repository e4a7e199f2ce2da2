// The float64 reference, random inputs and the acceptance rule.
#include "attnprof/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "attnprof/error.h"

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

}  // namespace

Inputs make_inputs(const Problem& p, std::uint64_t seed, Allocator& allocator, bool bshd) {
  Rng rng{seed * 0x2545f4914f6cdd1dull + 1};
  Inputs in;
  in.q = random_tensor({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, rng, allocator, bshd);
  in.k = random_tensor({p.batch, p.kv_heads, p.kv_seq, p.head_dim}, p.dtype, rng, allocator, bshd);
  in.v = random_tensor({p.batch, p.kv_heads, p.kv_seq, p.head_dim}, p.dtype, rng, allocator, bshd);
  const Dims full{p.batch, p.heads, p.seq, p.kv_seq};
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
    in.mask = m.expand(full);
  } else if (p.mask == MaskKind::Bias) {
    Tensor b = Tensor::empty({1, 1, p.seq, p.kv_seq}, p.dtype, allocator);
    for (std::int64_t i = 0, n = b.numel(); i < n; ++i) store_from_float(b.data(), p.dtype, i, 2.0f * rng.uniform());
    in.bias = b.expand(full);
  }
  return in;
}

RowSample sample_rows(const Problem& p, std::int64_t max_rows) {
  RowSample s;
  const std::int64_t total = p.batch * p.heads * p.seq;
  if (total <= max_rows) {
    s.rows.resize(static_cast<std::size_t>(total));
    for (std::int64_t r = 0; r < total; ++r) s.rows[static_cast<std::size_t>(r)] = r;
    return s;
  }
  // Whole heads are too many: take rows spread evenly over every (batch, head),
  // always including each head's first and last rows (the causal edges).
  const std::int64_t heads_total = p.batch * p.heads;
  const std::int64_t per_head = std::max<std::int64_t>(2, max_rows / heads_total);
  const std::int64_t head_step = std::max<std::int64_t>(1, heads_total * per_head / max_rows);
  for (std::int64_t bh = 0; bh < heads_total; bh += head_step) {
    for (std::int64_t k = 0; k < per_head; ++k) {
      const std::int64_t i = per_head == 1 ? 0 : k * (p.seq - 1) / (per_head - 1);
      s.rows.push_back(bh * p.seq + i);
    }
  }
  s.rows.erase(std::unique(s.rows.begin(), s.rows.end()), s.rows.end());
  return s;
}

ErrorStats check_against_reference(const Problem& p, const Inputs& in, const Tensor& out, const RowSample& rows) {
  if (out.device() != Device::Cpu) fail(ErrorKind::Internal, "reference check needs a CPU output");
  ErrorStats e;
  const double scale = p.softmax_scale();
  const std::int64_t D = p.head_dim, Skv = p.kv_seq;
  std::vector<double> scores(static_cast<std::size_t>(Skv)), ref(static_cast<std::size_t>(D)),
      qrow(static_cast<std::size_t>(D));
  std::vector<char> keep(static_cast<std::size_t>(Skv));
  // K and V of the current (batch, kv head) widened to double once: sampled
  // rows come sorted, so consecutive rows share them.
  std::vector<double> kd(static_cast<std::size_t>(Skv * D)), vd(kd.size());
  std::int64_t cached_b = -1, cached_hk = -1;
  double err2 = 0, ref2 = 0;
  for (const std::int64_t r : rows.rows) {
    const std::int64_t b = r / (p.heads * p.seq), h = (r / p.seq) % p.heads, i = r % p.seq;
    const std::int64_t hk = h / p.group();
    if (b != cached_b || hk != cached_hk) {
      for (std::int64_t j = 0; j < Skv; ++j) {
        for (std::int64_t d = 0; d < D; ++d) {
          kd[static_cast<std::size_t>(j * D + d)] = in.k.get(b, hk, j, d);
          vd[static_cast<std::size_t>(j * D + d)] = in.v.get(b, hk, j, d);
        }
      }
      cached_b = b;
      cached_hk = hk;
    }
    for (std::int64_t d = 0; d < D; ++d) qrow[static_cast<std::size_t>(d)] = in.q.get(b, h, i, d);
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
      const double* kr = kd.data() + j * D;
      for (std::int64_t d = 0; d < D; ++d) s += qrow[static_cast<std::size_t>(d)] * kr[d];
      s *= scale;
      if (p.mask == MaskKind::Bias) s += in.bias.get(b, h, i, j);
      scores[static_cast<std::size_t>(j)] = s;
      mx = std::max(mx, s);
      any = true;
    }
    std::fill(ref.begin(), ref.end(), 0.0);
    if (any) {
      double sum = 0;
      for (std::int64_t j = 0; j < Skv; ++j) {
        if (!keep[static_cast<std::size_t>(j)]) continue;
        const double w = std::exp(scores[static_cast<std::size_t>(j)] - mx);
        sum += w;
        const double* vr = vd.data() + j * D;
        for (std::int64_t d = 0; d < D; ++d) ref[static_cast<std::size_t>(d)] += w * vr[d];
      }
      for (auto& x : ref) x /= sum;
    }
    bool row_nan = false;
    double row_err2 = 0, row_ref2 = 0, row_max = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      const double o = out.get(b, h, i, d);
      if (!std::isfinite(o)) {
        ++e.nan_count;
        row_nan = true;
        continue;
      }
      const double diff = o - ref[static_cast<std::size_t>(d)];
      row_err2 += diff * diff;
      row_ref2 += ref[static_cast<std::size_t>(d)] * ref[static_cast<std::size_t>(d)];
      row_max = std::max(row_max, std::abs(diff));
    }
    ++e.rows_checked;
    if (row_nan) {
      ++e.nan_rows;
      if (!any) ++e.nan_rows_fully_masked;
      continue;
    }
    err2 += row_err2;
    ref2 += row_ref2;
    e.max_abs = std::max(e.max_abs, row_max);
  }
  e.rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return e;
}

double tolerance_floor(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 2e-5;  // "far under 1e-4"
    case DType::F16:
      return 1e-3;
    case DType::BF16:
      return 5e-3;
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
    std::snprintf(buf, sizeof buf, "rel %.2e %s 2 x %.2e (math) + %.0e", e.rel, a.pass ? "<=" : ">", *math_rel, floor);
  } else {
    std::snprintf(buf, sizeof buf, "rel %.2e %s %.1e", e.rel, a.pass ? "<=" : ">", a.tolerance);
  }
  a.why = buf;
  if (e.nan_rows > 0) a.why += " (NaN on fully masked rows, as documented)";
  return a;
}

}  // namespace attnprof
