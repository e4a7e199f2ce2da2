// flash's backward on the CPU: FlashAttention-2's algorithm. Nothing
// [S, Skv]-sized is kept: the forward saved only each row's log-sum-exp, and
// the backward recomputes the probabilities block by block,
//   P = exp(scale Q K^T - LSE),  dV += P^T dO,  dP = dO V^T,
//   dS = P (dP - D) with D = rowsum(dO * O),  dK += scale dS^T Q,  dQ += scale dS K.
// With a soft cap c, P = exp(c tanh(scale Q K^T / c) - LSE) and dS also takes
// the cap's derivative, 1 - tanh^2.
// A work item owns one (batch, kv head, block of keys): it walks the query
// blocks that can see its keys, for every query head of the grouped-query
// group, so its dK and dV rows are summed in its own tiles and written once.
//
// dQ of one query block gets a contribution from every key block, i.e. from
// several threads. Each item computes its contribution in a per-thread tile
// and adds it, under a lock per (batch, head, query block), to one shared FP32
// accumulator: memory stays one dQ in FP32 whatever the thread count (per-
// thread dQ partials would cost a dQ per thread), and the add is D x 64 floats
// against 10 x 64 x 64 x D FLOPs of the pair, so the locks are rarely
// contended. The order of those adds follows thread timing; with
// p.deterministic an item owns a whole (batch, kv head) instead, whose key
// blocks it walks in order, so every dQ sum has a fixed order.
//
// A packed batch (Problem::seq_lens): an item is a (sequence, kv head, key
// block), its keys and queries its sequence's own, and the dQ tiles are per
// (sequence's query block, head), so the sums stay within a sequence.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "backends/cpu/flash_simd.h"
#include "backends/cpu/flash_tiles.h"
#include "backends/cpu/ops.h"

namespace attnprof::cpu::flash {
namespace {

// Keys per item: 128 while the item's K, K^T and V rows and its dK and dV
// accumulators (5 x 128 x D floats, 320 KiB at D = 128) fit the 512 KiB L2
// next to the query block's tiles; 64 beyond (D = 256 would need 640 KiB).
// More keys per item means fewer passes over each query block's packing and
// its dQ tile's locked add.
std::int64_t key_block_rows(std::int64_t head_dim) { return head_dim <= 128 ? 128 : 64; }

constexpr int kTileRows = 6;  // 6 x 2 accumulators + 2 operands + 1 broadcast <= 16 ymm

// C[r][0..8*NV) (+)= sum_k A[r][k] B[k][0..8*NV) for r < MR: A broadcast, B
// loaded as vectors, all row-major.
template <int MR, int NV, bool kAccumulate>
inline void gemm_tile(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t depth, float* c,
                      std::int64_t ldc) {
  F8 acc[MR][NV];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? load(c + r * ldc + 8 * v) : zeros();
  for (std::int64_t k = 0; k < depth; ++k) {
    F8 bk[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bk[v] = load(b + k * ldb + 8 * v);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const F8 ar = broadcast(a + r * lda + k);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(ar, bk[v], acc[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) store(c + r * ldc + 8 * v, acc[r][v]);
}

template <int NV, bool kAccumulate>
void gemm_strip(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t rows,
                std::int64_t depth, float* c, std::int64_t ldc) {
  std::int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows)
    gemm_tile<kTileRows, NV, kAccumulate>(a + r * lda, lda, b, ldb, depth, c + r * ldc, ldc);
  a += r * lda;
  c += r * ldc;
  switch (rows - r) {
    case 0:
      break;
    case 1:
      gemm_tile<1, NV, kAccumulate>(a, lda, b, ldb, depth, c, ldc);
      break;
    case 2:
      gemm_tile<2, NV, kAccumulate>(a, lda, b, ldb, depth, c, ldc);
      break;
    case 3:
      gemm_tile<3, NV, kAccumulate>(a, lda, b, ldb, depth, c, ldc);
      break;
    case 4:
      gemm_tile<4, NV, kAccumulate>(a, lda, b, ldb, depth, c, ldc);
      break;
    default:
      gemm_tile<5, NV, kAccumulate>(a, lda, b, ldb, depth, c, ldc);
      break;
  }
}

// C[rows x cols] (+)= A[rows x depth] B[depth x cols], cols a multiple of 8.
// Column strips outermost: one strip of B (depth x 16 floats, 4 KiB for a
// depth of 64) stays in L1 while every row tile streams A.
template <bool kAccumulate>
void gemm(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t rows, std::int64_t cols,
          std::int64_t depth, float* c, std::int64_t ldc) {
  std::int64_t col = 0;
  for (; col + 16 <= cols; col += 16) gemm_strip<2, kAccumulate>(a, lda, b + col, ldb, rows, depth, c + col, ldc);
  if (col < cols) gemm_strip<1, kAccumulate>(a, lda, b + col, ldb, rows, depth, c + col, ldc);
}

// Per-thread tiles, in floats; every region starts on a 64-byte boundary.
struct Layout {
  std::int64_t block_k = 0;  // keys per item (key_block_rows)
  std::int64_t k = 0, kt = 0, v = 0, q = 0, qt = 0, dout = 0, doutt = 0, pt = 0, dst = 0, dk = 0, dv = 0, dqt = 0,
               lse2 = 0, delta = 0, total = 0;
};

Layout layout_for(std::int64_t head_dim) {
  const std::int64_t D = head_dim, dpad = round_up(head_dim, 8);
  Layout L;
  L.block_k = key_block_rows(head_dim);
  const std::int64_t keys = L.block_k;
  ScratchLayout scratch;
  const auto take = [&scratch](std::int64_t floats) { return scratch.take(floats); };
  L.k = take(keys * D);
  L.kt = take(D * keys);
  L.v = take(keys * D);
  L.q = take(kBlockQ * dpad);
  L.qt = take(D * kBlockQ);
  L.dout = take(kBlockQ * dpad);
  L.doutt = take(D * kBlockQ);
  L.pt = take(keys * kBlockQ);
  L.dst = take(keys * kBlockQ);
  L.dk = take(keys * dpad);
  L.dv = take(keys * dpad);
  L.dqt = take(D * kBlockQ);
  L.lse2 = take(kBlockQ);
  L.delta = take(kBlockQ);
  L.total = scratch.total;
  return L;
}

std::int64_t blocks(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

// Row i of t[b, h] (n elements) from FP32, rounded once to t's dtype.
void store_row(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t n, const float* src) {
  const std::int64_t base = t.index(b, h, i, 0);
  const std::int64_t inc = t.stride(3);
  if (t.dtype() == DType::F32 && inc == 1) {
    std::copy(src, src + n, t.data_as<float>() + base);
    return;
  }
  for (std::int64_t c = 0; c < n; ++c) store_from_float(t.data(), t.dtype(), base + c * inc, src[c]);
}

// Everything an item needs, fixed for one backward.
struct Job {
  const Problem& p;
  const Inputs& in;
  const Tensor& dout;
  const float* lse;                   // lse_dims(p): [B, H, S], or [1, H, total_q] packed
  const float* delta;                 // rowsum(dO * O), laid out as lse
  float* dq_acc;                      // [query blocks of all sequences, H, D, kBlockQ]: dQ^T tiles in FP32
  std::vector<std::mutex>& dq_locks;  // one per dQ^T tile
  const Gradients& grads;
  Layout layout;
  const std::vector<Sequence>& seqs;
  std::int64_t lse_rows;
  float q_scale;  // softmax scale * log2(e): the exponentials are base 2
  float scale;
  float cap2;  // soft cap * log2(e) (the logits are base 2); 0: no cap
  std::int64_t dpad;
};

// Query rows i0..i0+nq of head h: Q and dO row-major (zero past D) and
// transposed (zero past nq up to qcols), Q^T pre-scaled; the LSE in base 2,
// +inf on a fully masked row and on padding so that P = 2^(S - LSE) is 0
// there; D = rowsum(dO * O), 0 on padding.
void pack_queries(const Job& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                  std::int64_t qcols, float* scratch) {
  const Layout& L = job.layout;
  const std::int64_t D = job.p.head_dim;
  float* q = scratch + L.q;
  float* qt = scratch + L.qt;
  float* d_o = scratch + L.dout;
  float* d_ot = scratch + L.doutt;
  for (std::int64_t i = 0; i < nq; ++i) {
    float* qi = q + i * job.dpad;
    float* di = d_o + i * job.dpad;
    load_row(job.in.q, s.tb, h, s.q0 + i0 + i, D, qi);
    load_row(job.dout, s.tb, h, s.q0 + i0 + i, D, di);
    std::fill(qi + D, qi + job.dpad, 0.0f);
    std::fill(di + D, di + job.dpad, 0.0f);
    for (std::int64_t d = 0; d < D; ++d) {
      qt[d * kBlockQ + i] = qi[d] * job.q_scale;
      d_ot[d * kBlockQ + i] = di[d];
    }
  }
  for (std::int64_t d = 0; d < D; ++d) {
    std::fill(qt + d * kBlockQ + nq, qt + d * kBlockQ + qcols, 0.0f);
    std::fill(d_ot + d * kBlockQ + nq, d_ot + d * kBlockQ + qcols, 0.0f);
  }
  const std::int64_t row0 = (s.tb * job.p.heads + h) * job.lse_rows + s.q0 + i0;
  float* lse2 = scratch + L.lse2;
  float* delta = scratch + L.delta;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < qcols; ++i) {
    const float lse = i < nq ? job.lse[row0 + i] : kNegInf;
    lse2[i] = lse == kNegInf ? kInf : lse * kLog2e;
    delta[i] = i < nq ? job.delta[row0 + i] : 0.0f;
  }
}

// S^T (base-2 logits, masked) turned into P^T = 2^(S^T - LSE) in place, and
// dP^T into the scaled dS^T = scale P^T (dP^T - D), in place. With a soft cap
// (kCap) S^T holds the capped logits cap2 tanh(.), and dS^T also takes the
// cap's derivative 1 - t^2, t = S^T / cap2 recovered from them; a masked
// -inf gives -inf there, clamped to 0 (its P is 0 and 0 x -inf is NaN).
template <bool kCap>
void probabilities_and_ds(const Job& job, std::int64_t n, std::int64_t qcols, float* scratch) {
  const Layout& L = job.layout;
  const float* lse2 = scratch + L.lse2;
  const float* delta = scratch + L.delta;
  float* pt = scratch + L.pt;
  float* dst = scratch + L.dst;
  const F8 scale = splat(job.scale);
  const F8 inv_cap = splat(kCap ? 1.0f / job.cap2 : 0.0f);
  const F8 one = splat(1.0f);
  for (std::int64_t c = 0; c < qcols; c += 8) {
    const F8 shift = load(lse2 + c);
    const F8 dc = load(delta + c);
    for (std::int64_t j = 0; j < n; ++j) {
      float* pj = pt + j * kBlockQ + c;
      float* sj = dst + j * kBlockQ + c;
      const F8 s = load(pj);
      const F8 prob = exp2(sub(s, shift));
      store(pj, prob);
      F8 ds = mul(mul(prob, sub(load(sj), dc)), scale);
      if constexpr (kCap) {
        const F8 t = mul(s, inv_cap);
        ds = mul(ds, max(zeros(), sub(one, mul(t, t))));
      }
      store(sj, ds);
    }
  }
}

// One (sequence, kv head, key block): dK and dV of keys j0..j0+n, and the
// contributions of those keys to dQ; nothing past a short sequence's keys.
void key_block(const Job& job, std::int64_t b, std::int64_t hk, std::int64_t kb, float* scratch) {
  const Problem& p = job.p;
  const Sequence& s = job.seqs[static_cast<std::size_t>(b)];
  const Layout& L = job.layout;
  const Band& band = s.band;
  const std::int64_t D = p.head_dim, dpad = job.dpad;
  const std::int64_t block_k = L.block_k;
  const std::int64_t j0 = kb * block_k;
  if (j0 >= s.kv_seq) return;
  const std::int64_t n = std::min(block_k, s.kv_seq - j0);
  float* k = scratch + L.k;
  float* kt = scratch + L.kt;
  float* v = scratch + L.v;
  float* dk = scratch + L.dk;
  float* dv = scratch + L.dv;
  std::fill(dk, dk + n * dpad, 0.0f);
  std::fill(dv, dv + n * dpad, 0.0f);

  // The queries that can see any of these keys; a key none sees keeps zeros.
  const std::int64_t i_begin = band.has_hi ? std::max<std::int64_t>(0, j0 - band.hi) : 0;
  const std::int64_t i_end = band.has_lo ? std::min(s.seq, j0 + n - band.lo) : s.seq;
  if (i_begin < i_end) {
    for (std::int64_t j = 0; j < n; ++j) {
      load_row(job.in.k, s.tb, hk, s.k0 + j0 + j, D, k + j * D);
      load_row(job.in.v, s.tb, hk, s.k0 + j0 + j, D, v + j * D);
      for (std::int64_t d = 0; d < D; ++d) kt[d * block_k + j] = k[j * D + d];
    }
  }
  float* pt = scratch + L.pt;
  float* dst = scratch + L.dst;
  float* dqt = scratch + L.dqt;
  for (std::int64_t qb = i_begin / kBlockQ; i_begin < i_end && qb <= (i_end - 1) / kBlockQ; ++qb) {
    const std::int64_t i0 = qb * kBlockQ;
    const std::int64_t nq = std::min(kBlockQ, s.seq - i0);
    const std::int64_t qcols = round_up(nq, 16);
    const bool straddles = (band.has_hi && j0 + n - 1 > i0 + band.hi) || (band.has_lo && j0 < i0 + nq - 1 + band.lo);
    for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      pack_queries(job, s, h, i0, nq, qcols, scratch);
      gemm<false>(k, D, scratch + L.qt, kBlockQ, n, qcols, D, pt, kBlockQ);  // S^T = K Q^T
      if (job.cap2 > 0) soft_cap(job.cap2, n, qcols, pt);
      if (straddles) mask_band(band, i0, j0, n, qcols, pt);
      if (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias) mask_tensor(p, job.in, s.tb, h, i0, nq, j0, n, pt);
      gemm<false>(v, D, scratch + L.doutt, kBlockQ, n, qcols, D, dst, kBlockQ);  // dP^T = V dO^T
      if (job.cap2 > 0) {
        probabilities_and_ds<true>(job, n, qcols, scratch);
      } else {
        probabilities_and_ds<false>(job, n, qcols, scratch);
      }
      gemm<true>(pt, kBlockQ, scratch + L.dout, dpad, n, dpad, nq, dv, dpad);  // dV += P^T dO
      gemm<true>(dst, kBlockQ, scratch + L.q, dpad, n, dpad, nq, dk, dpad);    // dK += dS^T Q
      gemm<false>(kt, block_k, dst, kBlockQ, D, qcols, n, dqt, kBlockQ);       // dQ^T part = K^T dS^T

      const std::int64_t tile = (s.qb0 + qb) * p.heads + h;
      float* acc = job.dq_acc + tile * D * kBlockQ;
      const std::lock_guard<std::mutex> hold(job.dq_locks[static_cast<std::size_t>(tile)]);
      for (std::int64_t x = 0; x < D * kBlockQ; x += 8) store(acc + x, add(load(acc + x), load(dqt + x)));
    }
  }
  for (std::int64_t j = 0; j < n; ++j) {
    store_row(job.grads.dk, s.tb, hk, s.k0 + j0 + j, D, dk + j * dpad);
    store_row(job.grads.dv, s.tb, hk, s.k0 + j0 + j, D, dv + j * dpad);
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) fail(ErrorKind::InvalidArgument, "flash backward: " + what);
}

}  // namespace

std::size_t backward_workspace_bytes(const Problem& p, int threads) {
  const auto rows = static_cast<std::size_t>(p.heads * p.total_q());
  const auto dq_tiles = static_cast<std::size_t>(total_q_blocks(p) * p.heads * p.head_dim * kBlockQ);
  return sizeof(float) *
         (static_cast<std::size_t>(layout_for(p.head_dim).total) * static_cast<std::size_t>(threads) + rows + dq_tiles);
}

void backward(const Problem& problem, const Inputs& in, const Tensor& out, const Tensor& dout, const Tensor& lse,
              Gradients& grads, RunContext& ctx) {
  Problem p = problem;
  p.normalize();
  RecordFunction rf("flash_attention_backward", dtypes_string({&in.q, &in.k, &in.v, &out, &dout}),
                    dims_string(in.q) + ", " + dims_string(in.k) + ", " + dims_string(in.v));
  require_mask_tensor(p, in);
  // A key-padding mask is read as the tensor it is here (the forward's
  // lowering only skips work); caller-given lengths are a forward's.
  require(!in.kv_lens.defined(), "per-sequence key lengths (kv_lens) are taken by the forward only");
  require(lse.defined() && lse.dtype() == DType::F32 && lse.is_contiguous() && lse.sizes() == lse_dims(p),
          "the saved log-sum-exp must be FP32 " + dims_string(lse_dims(p)) + " from flash's forward_train");
  require(grads.dq.defined() && grads.dk.defined() && grads.dv.defined(), "dQ, dK and dV must be allocated");
  if (p.varlen()) require_shapes(p, in, "flash backward");

  const std::int64_t D = p.head_dim;
  const std::vector<Sequence> seqs = sequences_of(p);
  const std::int64_t q_tiles = total_q_blocks(p) * p.heads;
  // A packed batch's items run over its longest sequence's key blocks; those
  // past a shorter one's keys return at once.
  const std::int64_t k_blocks = blocks(p.kv_seq, key_block_rows(D));
  // Rows of the log-sum-exp (and of D): (tb * H + h) * per_head + row, where
  // row is the query's row in the tensors (packed: across the sequences).
  const std::int64_t per_head = lse_rows(p);
  const std::int64_t rows = p.heads * p.total_q();
  const Layout layout = layout_for(D);
  // Deterministic: an item is a whole (batch, kv head), its key blocks in order.
  const std::int64_t blocks_per_item = p.deterministic ? k_blocks : 1;
  const std::int64_t items = p.batch * p.kv_heads * (k_blocks / blocks_per_item);
  const int threads = static_cast<int>(std::min<std::int64_t>(resolve_threads(ctx.threads), std::max(items, rows)));

  Tensor scratch = Tensor::empty({threads, 1, 1, layout.total}, DType::F32, ctx.allocator);
  Tensor delta = Tensor::empty(lse_dims(p), DType::F32, ctx.allocator);
  Tensor dq_acc = Tensor::empty({q_tiles, 1, D, kBlockQ}, DType::F32, ctx.allocator);
  std::vector<std::mutex> dq_locks(static_cast<std::size_t>(q_tiles));
  const Job job{.p = p,
                .in = in,
                .dout = dout,
                .lse = lse.data_as<const float>(),
                .delta = delta.data_as<const float>(),
                .dq_acc = dq_acc.data_as<float>(),
                .dq_locks = dq_locks,
                .grads = grads,
                .layout = layout,
                .seqs = seqs,
                .lse_rows = per_head,
                .q_scale = static_cast<float>(p.softmax_scale() * std::numbers::log2e),
                .scale = static_cast<float>(p.softmax_scale()),
                .cap2 = static_cast<float>(p.softcap * std::numbers::log2e),
                .dpad = round_up(D, 8)};
  // Row r of a head's rows: its sequence and its row within it.
  const std::vector<std::int64_t> cu = p.cu_seqlens_q();
  const auto sequence_of = [&](std::int64_t tb, std::int64_t r) -> std::pair<std::int64_t, std::int64_t> {
    if (!p.varlen()) return {tb, r};
    const auto b = static_cast<std::int64_t>(std::upper_bound(cu.begin(), cu.end(), r) - cu.begin()) - 1;
    return {b, r - cu[static_cast<std::size_t>(b)]};
  };

#pragma omp parallel num_threads(threads)
  {
    float* mine = scratch.data_as<float>() + static_cast<std::int64_t>(omp_get_thread_num()) * layout.total;
    // D = rowsum(dO * O) per query row, from O as stored (what autograd sees),
    // and the dQ accumulator zeroed, before any item reads or adds to them.
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t th = row / per_head, r = row % per_head;  // th = tb * H + h
      load_row(out, th / p.heads, th % p.heads, r, D, mine + layout.q);
      load_row(dout, th / p.heads, th % p.heads, r, D, mine + layout.dout);
      float sum = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) sum += mine[layout.q + d] * mine[layout.dout + d];
      delta.data_as<float>()[row] = sum;
    }
#pragma omp for schedule(static)
    for (std::int64_t tile = 0; tile < q_tiles; ++tile) std::fill_n(job.dq_acc + tile * D * kBlockQ, D * kBlockQ, 0.0f);

      // Within a (batch, kv head) the first key blocks see the most queries
      // under causal masks; the dynamic schedule hands them out first.
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t per_pair = k_blocks / blocks_per_item;
      const std::int64_t bh = item / per_pair;
      const std::int64_t first = item % per_pair * blocks_per_item;
      for (std::int64_t kb = first; kb < first + blocks_per_item; ++kb)
        key_block(job, bh / p.kv_heads, bh % p.kv_heads, kb, mine);
    }

    // dQ^T tiles transposed back into dQ rows, rounded once.
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t th = row / per_head, r = row % per_head;
      const std::int64_t tb = th / p.heads, h = th % p.heads;
      const auto [b, i] = sequence_of(tb, r);
      const Sequence& s = seqs[static_cast<std::size_t>(b)];
      const float* tile = job.dq_acc + ((s.qb0 + i / kBlockQ) * p.heads + h) * D * kBlockQ + i % kBlockQ;
      float* buf = mine + layout.q;
      for (std::int64_t d = 0; d < D; ++d) buf[d] = tile[d * kBlockQ];
      store_row(grads.dq, tb, h, r, D, buf);
    }
  }
}

}  // namespace attnprof::cpu::flash
