// flash on the CPU: FlashAttention's tiled online softmax. Each work item is
// one (batch, head, block of kBlockQ query rows); it walks the visible key
// blocks, keeps a running max and sum per query row and rescales its FP32
// accumulator, so nothing [S, Skv]-sized ever exists. Work items run on OpenMP
// threads, each with its own scratch; blocks past the causal or window bounds
// are never visited and only blocks that straddle a bound are masked.
//
// A training forward also writes each row's log-sum-exp, from the same running
// max and sum, which is all the backward (flash_backward.cpp) keeps.
//
// A packed batch (Problem::seq_lens) runs the same items per sequence: the
// item's rows and keys are its sequence's own (its band at its own diagonal),
// placed in the packed tensors by the sequence's first row (Sequence, in
// flash_tiles.h), so no padding is read, computed or written.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/flash_microkernels.h"
#include "backends/cpu/flash_tiles.h"
#include "backends/cpu/ops.h"
#include "core/mask_lowering.h"

namespace attnprof::cpu {

namespace flash {

int resolve_threads(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

Band band_of(const Problem& p) { return band_of(p, p.seq, p.kv_seq); }

Band band_of(const Problem& p, std::int64_t seq, std::int64_t kv_seq) {
  const std::int64_t offset = kv_seq - seq;  // the bottom-right diagonal
  Band band;
  switch (p.mask) {
    case MaskKind::Causal:
      band.has_hi = true;
      break;
    case MaskKind::CausalBottomRight:
      band = {.has_hi = true, .hi = offset};
      break;
    case MaskKind::SlidingWindow:
      band = {.has_lo = true, .has_hi = true, .lo = offset - p.window + 1, .hi = offset};
      break;
    case MaskKind::None:
    case MaskKind::Boolean:
    case MaskKind::Bias:
      break;
  }
  return band;
}

std::vector<Sequence> sequences_of(const Problem& p) {
  std::vector<Sequence> seqs(static_cast<std::size_t>(p.batch));
  std::int64_t q0 = 0, k0 = 0, qb0 = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    Sequence& s = seqs[static_cast<std::size_t>(b)];
    s.seq = p.seq_len(b);
    s.kv_seq = p.kv_seq_len(b);
    s.band = band_of(p, s.seq, s.kv_seq);
    s.qb0 = qb0;
    qb0 += (s.seq + kBlockQ - 1) / kBlockQ;
    if (p.varlen()) {
      s.q0 = q0;
      s.k0 = k0;
      q0 += s.seq;
      k0 += s.kv_seq;
    } else {
      s.tb = b;
    }
  }
  return seqs;
}

std::int64_t total_q_blocks(const Problem& p) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) n += (p.seq_len(b) + kBlockQ - 1) / kBlockQ;
  return n;
}

Dims lse_dims(const Problem& p) {
  return p.varlen() ? Dims{1, p.heads, p.total_q(), 1} : Dims{p.batch, p.heads, p.seq, 1};
}

std::int64_t lse_rows(const Problem& p) { return p.varlen() ? p.total_q() : p.seq; }

void require_shapes(const Problem& p, const Inputs& in, const char* who) {
  const auto check = [&](const char* name, const Tensor& t, const Dims& want) {
    if (!t.defined() || t.sizes() != want) {
      fail(ErrorKind::InvalidArgument, std::string(who) + ": " + name + " must be " + dims_string(want) + " for " +
                                           p.describe() + ", got " + (t.defined() ? t.dims_string() : "none"));
    }
  };
  check("q", in.q, p.q_dims());
  check("k", in.k, p.kv_dims());
  check("v", in.v, p.kv_dims());
}

void load_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n, float* dst) {
  const std::int64_t base = t.index(b, h, i, 0);
  const std::int64_t inc = t.stride(3);
  const void* data = t.data();
  if (inc != 1 && n > 1) {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = load_as_float(data, t.dtype(), base + c * inc);
    return;
  }
  std::int64_t c = 0;
  switch (t.dtype()) {
    case DType::F32:
      std::memcpy(dst, static_cast<const float*>(data) + base, static_cast<std::size_t>(n) * 4);
      return;
    case DType::F16: {
      const auto* src = static_cast<const std::uint16_t*>(data) + base;
      for (; c + 8 <= n; c += 8) store(dst + c, load_f16(src + c));
      break;
    }
    case DType::BF16: {
      const auto* src = static_cast<const std::uint16_t*>(data) + base;
      for (; c + 8 <= n; c += 8) store(dst + c, load_bf16(src + c));
      break;
    }
    case DType::Bool:
    case DType::I32:
      break;
  }
  for (; c < n; ++c) dst[c] = load_as_float(data, t.dtype(), base + c);
}

// Per key row the visible query columns are one interval.
void mask_band(const Band& band, std::int64_t i0, std::int64_t j0, std::int64_t n, std::int64_t qcols, float* st) {
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t key = j0 + j;
    const std::int64_t first = band.has_hi ? std::clamp(key - band.hi - i0, std::int64_t{0}, qcols) : 0;
    const std::int64_t end = band.has_lo ? std::clamp(key - band.lo - i0 + 1, first, qcols) : qcols;
    float* row = st + j * kBlockQ;
    std::fill(row, row + first, kNegInf);
    std::fill(row + end, row + qcols, kNegInf);
  }
}

// qcols is a multiple of 16: whole vectors, eight query columns at a time.
void soft_cap(float cap2, std::int64_t n, std::int64_t qcols, float* st) {
  const F8 cap = splat(cap2), inv = splat(1.0f / cap2);
  for (std::int64_t j = 0; j < n; ++j) {
    float* row = st + j * kBlockQ;
    for (std::int64_t c = 0; c < qcols; c += 8) store(row + c, mul(cap, tanh(mul(load(row + c), inv))));
  }
}

// Masks and biases are read row by row through the tensor's strides, so
// [1, 1, S, Skv] and stride-0 expanded views both work.
void mask_tensor(const Problem& p, const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq,
                 std::int64_t j0, std::int64_t n, float* st) {
  const bool boolean = p.mask == MaskKind::Boolean;
  const Tensor& t = boolean ? in.mask : in.bias;
  const std::int64_t tb = t.size(0) == 1 ? 0 : b;
  const std::int64_t th = t.size(1) == 1 ? 0 : h;
  const std::int64_t inc = t.stride(3);
  for (std::int64_t c = 0; c < nq; ++c) {
    const std::int64_t base = t.index(tb, th, i0 + c, j0);
    if (boolean) {
      const auto* keep = t.data_as<const std::uint8_t>() + base;
      for (std::int64_t j = 0; j < n; ++j)
        if (!keep[j * inc]) st[j * kBlockQ + c] = kNegInf;
    } else if (t.dtype() == DType::F32) {
      const float* bias = t.data_as<const float>() + base;
      for (std::int64_t j = 0; j < n; ++j) st[j * kBlockQ + c] += kLog2e * bias[j * inc];
    } else {
      for (std::int64_t j = 0; j < n; ++j)
        st[j * kBlockQ + c] += kLog2e * load_as_float(t.data(), t.dtype(), base + j * inc);
    }
  }
}

std::string check_problem(const Problem& p) {
  if (p.device != Device::Cpu) return "the CPU flash backend runs on the CPU; use device=cpu";
  try {
    Problem q = p;
    q.normalize();
    q.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

std::vector<std::int32_t> kv_lengths(const Problem& p, const Tensor& kv_lens) {
  if (kv_lens.dtype() != DType::I32 || kv_lens.device() != Device::Cpu || kv_lens.sizes() != Dims{1, 1, 1, p.batch}) {
    fail(ErrorKind::InvalidArgument, "flash: per-sequence key lengths must be int32 [1, 1, 1, " +
                                         std::to_string(p.batch) + "] on the CPU; got " + kv_lens.describe());
  }
  std::vector<std::int32_t> lens(static_cast<std::size_t>(p.batch));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const auto len = static_cast<std::int64_t>(kv_lens.data_as<const std::int32_t>()[b * kv_lens.stride(3)]);
    if (len < 0 || len > p.kv_seq) {
      fail(ErrorKind::InvalidArgument, "flash: sequence " + std::to_string(b) + " has " + std::to_string(len) +
                                           " keys, outside 0 .. kv_seq = " + std::to_string(p.kv_seq));
    }
    lens[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(len);
  }
  return lens;
}

void require_mask_tensor(const Problem& p, const Inputs& in) {
  if (p.mask == MaskKind::Boolean && !in.mask.defined())
    fail(ErrorKind::InvalidArgument, "flash: a boolean mask problem needs Inputs::mask");
  if (p.mask == MaskKind::Bias && !in.bias.defined())
    fail(ErrorKind::InvalidArgument, "flash: a bias mask problem needs Inputs::bias");
}

}  // namespace flash

namespace {

using namespace flash;

// 128 keys: a block's S^T (128 x 64 floats, 32 KiB) and the K and V rows it
// reads stay in the 512 KiB L2 next to the accumulator, while the per-block
// softmax bookkeeping is amortised over twice as many keys as with 64.
constexpr std::int64_t kBlockK = 128;

// Per-thread scratch, in floats; every region starts on a 64-byte boundary.
struct Layout {
  std::int64_t qt = 0, k = 0, v = 0, s = 0, o = 0, m = 0, l = 0, alpha = 0, total = 0;
};

Layout layout_for(std::int64_t head_dim) {
  const std::int64_t dpad = round_up(head_dim, 8);
  Layout L;
  ScratchLayout scratch;
  const auto take = [&scratch](std::int64_t floats) { return scratch.take(floats); };
  L.qt = take(head_dim * kBlockQ);
  L.k = take(kBlockK * head_dim);
  L.v = take(kBlockK * dpad);
  L.s = take(kBlockK * kBlockQ);
  L.o = take(kBlockQ * dpad);
  L.m = take(kBlockQ);
  L.l = take(kBlockQ);
  L.alpha = take(kBlockQ);
  L.total = scratch.total;
  return L;
}

// Everything a work item needs, fixed for one forward.
struct Job {
  const Problem& p;
  const Inputs& in;
  const Tensor& out;
  Layout layout;
  float q_scale;      // softmax scale * log2(e): the exponentials are base 2
  float cap2;         // soft cap * log2(e) (the logits are base 2); 0: no cap
  std::int64_t dpad;  // head_dim rounded up to 8, the accumulator's row length
  bool k_in_place;    // FP32 unit-stride K rows are read where they lie
  bool v_in_place;    // likewise V, when its rows are also whole vectors
  float* lse;         // forward_train: each row's log-sum-exp, contiguous lse_dims(p); null otherwise
  const std::vector<Sequence>& seqs;
  std::int64_t lse_rows;  // rows per head of the log-sum-exp (lse_rows(p))
  bool mask_lowered;      // the Boolean mask is per-sequence key lengths (in seqs): never read per element
};

// Key j's K or V row of sequence b, kv head hk, widened to FP32: from the
// logical tensor, or with a paged cache from page block_table[b][j / page] at
// row j % page (the pages are read where they lie, never gathered).
void load_kv_row(const Job& job, const Tensor& logical, const Tensor& pages, const Sequence& s, std::int64_t hk,
                 std::int64_t j, float* dst) {
  const std::int64_t D = job.p.head_dim;
  if (job.p.kv_cache != KvCache::Paged) {
    load_row(logical, s.tb, hk, s.k0 + j, D, dst);
    return;
  }
  const std::int64_t b = s.tb;  // a paged cache is never packed
  const Tensor& table = job.in.block_table;
  const std::int64_t page = job.p.page_size;
  const std::int64_t phys = table.data_as<const std::int32_t>()[b * table.stride(2) + (j / page) * table.stride(3)];
  load_row(pages, phys, hk, j % page, D, dst);
}

// Query rows i0..i0+nq transposed into qt[d][i] and pre-scaled; columns up to
// qcols are zero so padded lanes compute harmless values.
void pack_q(const Job& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq, std::int64_t qcols,
            float* qt, float* row) {
  const std::int64_t D = job.p.head_dim;
  for (std::int64_t i = 0; i < nq; ++i) {
    load_row(job.in.q, s.tb, h, s.q0 + i0 + i, D, row);
    for (std::int64_t d = 0; d < D; ++d) qt[d * kBlockQ + i] = row[d] * job.q_scale;
  }
  for (std::int64_t d = 0; d < D; ++d) std::fill(qt + d * kBlockQ + nq, qt + d * kBlockQ + qcols, 0.0f);
}

// out rows = O / l, zeros where l == 0 (every key masked: never NaN); and for
// a training forward each row's natural-log LSE, ln(l) + m ln 2 (m is the
// base-2 running max), -inf where l == 0.
void store_rows(const Job& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq, const float* o,
                const float* m, const float* l) {
  const Tensor& out = job.out;
  const std::int64_t D = job.p.head_dim;
  const std::int64_t inc = out.stride(3);
  if (job.lse) {
    float* lse = job.lse + (s.tb * job.p.heads + h) * job.lse_rows + s.q0 + i0;
    for (std::int64_t i = 0; i < nq; ++i)
      lse[i] = l[i] > 0.0f ? std::log(l[i]) + m[i] * std::numbers::ln2_v<float> : kNegInf;
  }
  for (std::int64_t i = 0; i < nq; ++i) {
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    const float* src = o + i * job.dpad;
    const std::int64_t base = out.index(s.tb, h, s.q0 + i0 + i, 0);
    if (out.dtype() == DType::F32 && inc == 1) {
      float* dst = out.data_as<float>() + base;
      for (std::int64_t d = 0; d < D; ++d) dst[d] = src[d] * inv;
    } else {
      for (std::int64_t d = 0; d < D; ++d) store_from_float(out.data(), out.dtype(), base + d * inc, src[d] * inv);
    }
  }
}

// One work item: query rows [i0, i0 + nq) of (sequence b, head h) against
// every visible key of the sequence; nothing past a short sequence's end.
void attend_block(const Job& job, std::int64_t b, std::int64_t h, std::int64_t i0, float* scratch) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  if (i0 >= s.seq) return;
  const Layout& L = job.layout;
  const std::int64_t D = p.head_dim;
  const std::int64_t hk = h / p.group();
  const std::int64_t nq = std::min(kBlockQ, s.seq - i0);
  const std::int64_t qcols = round_up(nq, 16);
  float* qt = scratch + L.qt;
  float* st = scratch + L.s;
  float* o = scratch + L.o;
  float* m = scratch + L.m;
  float* l = scratch + L.l;
  float* alpha = scratch + L.alpha;

  std::fill(o, o + nq * job.dpad, 0.0f);
  std::fill(m, m + kBlockQ, kNegInf);
  std::fill(l, l + kBlockQ, 0.0f);

  // The keys any row of this block can see; rows outside it stay all-masked.
  const Band& band = s.band;
  const std::int64_t last = i0 + nq - 1;
  const std::int64_t k_begin = band.has_lo ? std::max<std::int64_t>(0, i0 + band.lo) : 0;
  const std::int64_t k_end = band.has_hi ? std::min(s.kv_seq, last + band.hi + 1) : s.kv_seq;
  if (k_begin < k_end) pack_q(job, s, h, i0, nq, qcols, qt, st);

  const Tensor& K = job.in.k;
  const Tensor& V = job.in.v;
  for (std::int64_t j0 = k_begin; j0 < k_end; j0 += kBlockK) {
    const std::int64_t n = std::min(kBlockK, k_end - j0);

    const float* k_rows = scratch + L.k;
    std::int64_t ldk = D;
    if (job.k_in_place) {
      k_rows = K.data_as<const float>() + K.index(s.tb, hk, s.k0 + j0, 0);
      ldk = K.stride(2);
    } else {
      for (std::int64_t j = 0; j < n; ++j) load_kv_row(job, K, job.in.k_pages, s, hk, j0 + j, scratch + L.k + j * D);
    }
    Prefetch v_next;
    if (job.v_in_place)
      v_next = {.rows = V.data_as<const float>() + V.index(s.tb, hk, s.k0 + j0, 0), .ld = V.stride(2), .floats = D};
    qk_block(k_rows, ldk, n, qt, kBlockQ, qcols, D, st, kBlockQ, v_next);
    if (job.cap2 > 0) soft_cap(job.cap2, n, qcols, st);

    const bool straddles = (band.has_hi && j0 + n - 1 > i0 + band.hi) || (band.has_lo && j0 < last + band.lo);
    if (straddles) mask_band(band, i0, j0, n, qcols, st);
    if ((p.mask == MaskKind::Boolean && !job.mask_lowered) || p.mask == MaskKind::Bias)
      mask_tensor(p, job.in, s.tb, h, i0, nq, j0, n, st);

    online_softmax(st, kBlockQ, n, qcols, m, l, alpha);

    const float* v_rows = scratch + L.v;
    std::int64_t ldv = job.dpad;
    if (job.v_in_place) {
      v_rows = V.data_as<const float>() + V.index(s.tb, hk, s.k0 + j0, 0);
      ldv = V.stride(2);
    } else {
      for (std::int64_t j = 0; j < n; ++j) {
        float* row = scratch + L.v + j * job.dpad;
        load_kv_row(job, V, job.in.v_pages, s, hk, j0 + j, row);
        std::fill(row + D, row + job.dpad, 0.0f);
      }
    }
    pv_block(st, kBlockQ, v_rows, ldv, n, nq, job.dpad, alpha, o, job.dpad);
  }
  store_rows(job, s, h, i0, nq, o, m, l);
}

// What a packed batch adds to the eligibility's story.
std::string packed(const Problem& p) {
  if (!p.varlen()) return {};
  return ", " + std::to_string(p.batch) + " packed sequences, each against its own keys";
}

class FlashCpu final : public Backend {
 public:
  std::string_view name() const override { return "flash"; }
  Device device() const override { return Device::Cpu; }

  Eligibility eligibility(const Problem& p) const override {
    if (std::string why = check_problem(p); !why.empty()) return {.eligible = false, .reason = why};
    const std::string threads = std::to_string(omp_get_max_threads()) + " threads";
    char cap_buf[64] = "";
    if (p.softcap > 0) std::snprintf(cap_buf, sizeof cap_buf, ", scores soft-capped at %g per key block", p.softcap);
    const std::string cap = cap_buf;
    if (p.pass == Pass::Forward) {
      const std::string paged =
          p.kv_cache == KvCache::Paged ? ", K and V read from their pages through the block table" : "";
      const std::string lowered =
          p.mask == MaskKind::Boolean
              ? ", a key-padding mask lowered to per-sequence key lengths (others read per element)"
              : "";
      return {.eligible = true,
              .reason = "tiled online softmax, " + threads + cap + paged + lowered + packed(p) +
                        ", never materialises [S, Skv]"};
    }
    return {.eligible = true,
            .reason = "FlashAttention-2 backward recomputing P from the saved log-sum-exp, " + threads + cap +
                      packed(p) + (p.deterministic ? ", dQ summed in a fixed order" : "") +
                      ", never materialises [S, Skv]"};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    const int threads = omp_get_max_threads();
    const std::size_t forward =
        static_cast<std::size_t>(layout_for(p.head_dim).total) * sizeof(float) * static_cast<std::size_t>(threads);
    if (p.pass == Pass::Forward) return forward;
    Problem q = p;
    q.normalize();
    return forward + q.lse_bytes() + backward_workspace_bytes(q, threads);
  }

  Expectation expectation(const Problem& p) const override {
    switch (p.pass) {
      case Pass::Backward:
        return {.cpu_ops = {"flash_attention_backward"}, .copies = 0};
      case Pass::Train:
        return {.cpu_ops = {"flash_attention", "flash_attention_backward"}, .copies = 0};
      case Pass::Forward:
        break;
    }
    return {.cpu_ops = {"flash_attention"}, .copies = 0};
  }

  bool has_backward() const override { return true; }
  // The backward recomputes P from the saved log-sum-exp, tile by tile, and
  // adds each key block's dQ under a lock in the order the threads get there.
  Traits traits() const override {
    return {
        .backward_recomputes = true, .backward_dq_unordered = true, .softcap = true, .kv_lens = true, .varlen = true};
  }

  void forward(const Problem& problem, const Inputs& in, Tensor& out, RunContext& ctx) override {
    run_forward(problem, in, out, nullptr, ctx);
  }

  // The LSE, FP32 lse_dims(p) ([B, H, S, 1], or [1, H, total_q, 1] packed), is all the backward needs beyond the inputs
  // and O.
  void forward_train(const Problem& problem, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx) override {
    Problem p = problem;
    p.normalize();
    saved.probs = {};
    saved.lse = Tensor::empty(lse_dims(p), DType::F32, ctx.allocator);
    run_forward(p, in, out, saved.lse.data_as<float>(), ctx);
  }

  void backward(const Problem& p, const Inputs& in, const Tensor& out, const Tensor& dout, const Saved& saved,
                Gradients& grads, RunContext& ctx) override {
    flash::backward(p, in, out, dout, saved.lse, grads, ctx);
  }

 private:
  static void run_forward(const Problem& problem, const Inputs& in, Tensor& out, float* lse, RunContext& ctx) {
    Problem p = problem;
    p.normalize();
    RecordFunction rf("flash_attention", dtypes_string({&in.q, &in.k, &in.v}),
                      dims_string(in.q) + ", " + dims_string(in.k) + ", " + dims_string(in.v));
    require_mask_tensor(p, in);
    if (p.kv_cache == KvCache::Paged && (!in.k_pages.defined() || !in.v_pages.defined() || !in.block_table.defined())) {
      fail(ErrorKind::InvalidArgument,
           "flash: kv_cache=paged without the pages and block table (make_inputs makes them)");
    }
    // Per-sequence lengths: the caller's (kv_lens), and a key-padding mask's,
    // the shorter of the two.
    std::vector<std::int32_t> lens;
    if (in.kv_lens.defined()) lens = kv_lengths(p, in.kv_lens);
    if (p.varlen()) require_shapes(p, in, "flash");
    // The pages each sequence reads (a prefix cache's tables share pages,
    // and past its pages a row is not read).
    if (p.kv_cache == KvCache::Paged)
      check_block_table_reads(p, in.block_table, in.k_pages.size(0), lens.empty() ? nullptr : lens.data());
    const std::optional<std::vector<std::int32_t>> lowered =
        p.mask == MaskKind::Boolean ? key_padding_lengths(in.mask) : std::nullopt;
    if (lowered && lens.empty()) {
      lens = *lowered;
    } else if (lowered) {
      for (std::size_t b = 0; b < lens.size(); ++b) lens[b] = std::min(lens[b], (*lowered)[b]);
    }
    if (!lens.empty() && p.varlen()) {
      fail(ErrorKind::InvalidArgument,
           "flash: per-sequence key lengths (kv_lens, a key-padding mask) do not combine with a packed batch");
    }
    // Each sequence's keys and band from those lengths: the bottom-right
    // alignment (CausalBottomRight, SlidingWindow) is then the sequence's own.
    std::vector<Sequence> seqs = sequences_of(p);
    for (std::size_t b = 0; b < lens.size(); ++b) {
      seqs[b].kv_seq = lens[b];
      seqs[b].band = band_of(p, seqs[b].seq, lens[b]);
    }

    const std::int64_t D = p.head_dim;
    // A paged cache's rows are copied out of their pages (load_kv_row).
    const bool paged = p.kv_cache == KvCache::Paged;
    const bool k_unit = !paged && (in.k.stride(3) == 1 || D == 1);
    const bool v_unit = !paged && (in.v.stride(3) == 1 || D == 1);
    const Job job{.p = p,
                  .in = in,
                  .out = out,
                  .layout = layout_for(D),
                  .q_scale = static_cast<float>(p.softmax_scale() * std::numbers::log2e),
                  .cap2 = static_cast<float>(p.softcap * std::numbers::log2e),
                  .dpad = round_up(D, 8),
                  .k_in_place = in.k.dtype() == DType::F32 && k_unit,
                  .v_in_place = in.v.dtype() == DType::F32 && v_unit && D % 8 == 0,
                  .lse = lse,
                  .seqs = seqs,
                  .lse_rows = lse_rows(p),
                  .mask_lowered = lowered.has_value()};

    // A packed batch's items run over its longest sequence's query blocks;
    // those past a shorter one's end return at once.
    const std::int64_t q_blocks = (p.seq + kBlockQ - 1) / kBlockQ;
    const std::int64_t heads = p.batch * p.heads;
    const std::int64_t items = heads * q_blocks;
    const int threads =
        static_cast<int>(std::min<std::int64_t>(resolve_threads(ctx.threads), std::max<std::int64_t>(items, 1)));

    Tensor scratch = Tensor::empty({threads, 1, 1, job.layout.total}, DType::F32, ctx.allocator);
    float* scratch_base = scratch.data_as<float>();

    // Items run head by head, so both threads share one head's K and V in
    // cache; within a head the later query blocks, which see more keys under
    // causal masks, are handed out first (dynamic schedule), so the last
    // items to finish are the short ones.
#pragma omp parallel num_threads(threads)
    {
      float* mine = scratch_base + static_cast<std::int64_t>(omp_get_thread_num()) * job.layout.total;
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t item = 0; item < items; ++item) {
        const std::int64_t bh = item / q_blocks;
        const std::int64_t qb = q_blocks - 1 - item % q_blocks;
        attend_block(job, bh / p.heads, bh % p.heads, qb * kBlockQ, mine);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_flash() { return std::make_unique<FlashCpu>(); }

}  // namespace attnprof::cpu
