// The float64 reference (forward and gradients): each checked row's softmax and backward recomputed in float64 and
// compared with a backend's output. Which rows it checks is reference_sampling.cpp, the acceptance rule
// reference_acceptance.cpp; the random inputs it checks are inputs.cpp.
#include "attnprof/reference.h"

#include <algorithm>
#include <cmath>
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
#include "core/rows.h"

namespace attnprof {
namespace {

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
// probabilities and output are zeros (the NaN-safe convention): every key
// hidden by the mask, or every visible score -inf (a bias of -inf is a mask
// too, as PyTorch's _safe_softmax reads it). A NaN score (a NaN or an inf in
// q, k or the bias) makes the row's output NaN, as PyTorch's SDPA gives it:
// the max skips it, the sum does not.
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
    bool any = false, nan = false;
    for (std::int64_t j = 0; j < Skv; ++j) {
      bool vis = true;
      if (p.mask == MaskKind::Boolean) {
        vis = in.mask.get(b, h, i, j) != 0.0f;
      } else if (p.mask == MaskKind::Bias) {
        // A bias of -inf hides the key as a mask does, its score's NaN or inf too.
        vis = in.bias.get(b, h, i, j) != -std::numeric_limits<float>::infinity();
      } else {
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
      nan = nan || std::isnan(s);
      any = true;
    }
    if (!any || (mx == -std::numeric_limits<double>::infinity() && !nan)) {
      std::fill(prob.begin(), prob.end(), 0.0);
      return false;
    }
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

// Whether a and b are the same non-finite value (both NaN, or one infinity).
bool same_nonfinite(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && a == b); }

// Accumulates one checked row of `got` (read through `at`) against `ref`.
// Where the reference itself is NaN or inf (non-finite inputs), the output
// must be the same there; a non-finite output where the reference is finite
// on a row it defines, or a finite one where it is not, makes the relative
// error NaN: such an output is never reported as close (ErrorStats::rel).
class ErrorAccumulator {
 public:
  template <class At>
  void row(const std::vector<double>& ref, bool reference_defined, At at) {
    bool row_nan = false;
    double row_err2 = 0, row_ref2 = 0, row_max = 0;
    for (std::size_t d = 0; d < ref.size(); ++d) {
      const double o = at(static_cast<std::int64_t>(d));
      if (!std::isfinite(ref[d])) {
        if (same_nonfinite(o, ref[d])) {
          ++e_.nonfinite_expected;
        } else if (std::isfinite(o)) {
          ++e_.nonfinite_hidden;
        } else {
          ++e_.nan_count;
          row_nan = true;
        }
        continue;
      }
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
    const bool unexplained = e_.nan_rows > e_.nan_rows_fully_masked || e_.nonfinite_hidden > 0;
    e_.rel = unexplained ? std::numeric_limits<double>::quiet_NaN()
             : ref2_ > 0 ? std::sqrt(err2_ / ref2_)
                         : std::sqrt(err2_);
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
    tb = sequence_views(whole)[static_cast<std::size_t>(b_)].tb;  // the one sequence view (core/rows.h)
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

ErrorStats check_against_reference(const Problem& p, const Inputs& in, const Tensor& out, const RowSample& rows) {
  if (out.device() != Device::Cpu) fail(ErrorKind::Internal, "reference check needs a CPU output");
  if (has_rows(in)) {  // the rows as the Boolean mask that says the same
    const LoweredRows l = lower_rows(p, in, cpu_allocator());
    return check_against_reference(l.p, l.in, out, rows);
  }
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

GradientErrors check_gradients_against_reference(const Problem& p, const Inputs& in, const Tensor& dout,
                                                 const Gradients& g, const RowSample& q_rows,
                                                 const RowSample& kv_rows) {
  for (const Tensor* t : {&dout, &g.dq, &g.dk, &g.dv}) {
    if (t->device() != Device::Cpu) fail(ErrorKind::Internal, "gradient check needs CPU tensors");
  }
  if (has_rows(in)) {  // the rows as the Boolean mask that says the same
    const LoweredRows l = lower_rows(p, in, cpu_allocator());
    return check_gradients_against_reference(l.p, l.in, dout, g, q_rows, kv_rows);
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

}  // namespace attnprof
