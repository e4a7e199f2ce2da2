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
#include "backends/cpu/flash_kernels.h"
#include "backends/cpu/ops.h"

namespace attnprof::cpu::flash {
namespace {

std::int64_t blocks(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

void require(bool ok, const std::string& what) {
  if (!ok) fail(ErrorKind::InvalidArgument, "flash backward: " + what);
}

}  // namespace

std::size_t backward_workspace_bytes(const Problem& p, int threads) {
  const Kernels& k = kernels_for_run(choose_isa().isa);
  const auto rows = static_cast<std::size_t>(p.heads * p.total_q());
  const auto dq_tiles = static_cast<std::size_t>(total_q_blocks(p) * p.heads * p.head_dim * kBlockQ);
  return sizeof(float) *
         (static_cast<std::size_t>(k.backward_scratch_floats(p.head_dim)) * static_cast<std::size_t>(threads) + rows +
          dq_tiles);
}

void backward(const Problem& problem, const Inputs& in, const Tensor& out, const Tensor& dout, const Tensor& lse,
              Gradients& grads, RunContext& ctx) {
  Problem p = problem;
  p.normalize();
  RecordFunction rf("flash_attention_backward", dtypes_string({&in.q, &in.k, &in.v, &out, &dout}),
                    dims_string(in.q) + ", " + dims_string(in.k) + ", " + dims_string(in.v));
  require_mask_tensor(p, in);
  // A key-padding mask is read as the tensor it is here (the forward's
  // lowering only skips work); a caller's rows (q_rows, kv_rows) bound each
  // sequence's items as in the forward.
  const std::vector<SequenceRows> seq_rows = sequence_rows(p, in);
  require(lse.defined() && lse.dtype() == DType::F32 && lse.is_contiguous() && lse.sizes() == lse_dims(p),
          "the saved log-sum-exp must be FP32 " + dims_string(lse_dims(p)) + " from flash's forward_train");
  require(grads.dq.defined() && grads.dk.defined() && grads.dv.defined(), "dQ, dK and dV must be allocated");
  if (p.varlen()) require_shapes(p, in, "flash backward");

  // The kernels of the level cpu_isa.h picks: never one this CPU lacks.
  const IsaChoice isa = choose_isa();
  if (!isa.error.empty()) fail(ErrorKind::Unsupported, "flash backward: " + isa.error);
  const Kernels& kernels = kernels_for_run(isa.isa);

  const std::int64_t D = p.head_dim;
  const std::vector<Sequence> seqs = sequences_of(p, seq_rows);
  const std::int64_t q_tiles = total_q_blocks(p) * p.heads;
  // A packed batch's items run over its longest sequence's key blocks; those
  // past a shorter one's keys return at once.
  const std::int64_t k_blocks = blocks(p.kv_seq, kernels.backward_key_rows(D));
  // Rows of the log-sum-exp (and of D): (tb * H + h) * per_head + row, where
  // row is the query's row in the tensors (packed: across the sequences).
  const std::int64_t per_head = lse_rows(p);
  const std::int64_t rows = p.heads * p.total_q();
  const std::int64_t per_thread = kernels.backward_scratch_floats(D);
  const std::int64_t row_floats = round_up(D, 16);  // the drivers' row buffers at the start of a thread's scratch
  // Deterministic: an item is a whole (batch, kv head), its key blocks in order.
  const std::int64_t blocks_per_item = p.deterministic ? k_blocks : 1;
  const std::int64_t items = p.batch * p.kv_heads * (k_blocks / blocks_per_item);
  const int threads = static_cast<int>(std::min<std::int64_t>(resolve_threads(ctx.threads), std::max(items, rows)));

  Tensor scratch = Tensor::empty({threads, 1, 1, per_thread}, DType::F32, ctx.allocator);
  Tensor delta = Tensor::empty(lse_dims(p), DType::F32, ctx.allocator);
  Tensor dq_acc = Tensor::empty({q_tiles, 1, D, kBlockQ}, DType::F32, ctx.allocator);
  std::vector<std::mutex> dq_locks(static_cast<std::size_t>(q_tiles));
  const BackwardJob job{.p = p,
                        .in = in,
                        .dout = dout,
                        .lse = lse.data_as<const float>(),
                        .delta = delta.data_as<const float>(),
                        .dq_acc = dq_acc.data_as<float>(),
                        .dq_locks = dq_locks,
                        .grads = grads,
                        .seqs = seqs,
                        .lse_rows = per_head,
                        .q_scale = static_cast<float>(p.softmax_scale() * std::numbers::log2e),
                        .scale = static_cast<float>(p.softmax_scale()),
                        .cap2 = static_cast<float>(p.softcap * std::numbers::log2e)};
  // Row r of a head's rows: its sequence and its row within it.
  const std::vector<std::int64_t> cu = p.cu_seqlens_q();
  const auto sequence_of = [&](std::int64_t tb, std::int64_t r) -> std::pair<std::int64_t, std::int64_t> {
    if (!p.varlen()) return {tb, r};
    const auto b = static_cast<std::int64_t>(std::upper_bound(cu.begin(), cu.end(), r) - cu.begin()) - 1;
    return {b, r - cu[static_cast<std::size_t>(b)]};
  };

#pragma omp parallel num_threads(threads)
  {
    float* mine = scratch.data_as<float>() + static_cast<std::int64_t>(omp_get_thread_num()) * per_thread;
    // D = rowsum(dO * O) per query row, from O as stored (what autograd sees),
    // and the dQ accumulator zeroed, before any item reads or adds to them.
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t th = row / per_head, r = row % per_head;  // th = tb * H + h
      load_row(out, th / p.heads, th % p.heads, r, D, mine);
      load_row(dout, th / p.heads, th % p.heads, r, D, mine + row_floats);
      float sum = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) sum += mine[d] * mine[row_floats + d];
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
        kernels.key_block(job, bh / p.kv_heads, bh % p.kv_heads, kb, mine);
    }

    // dQ^T tiles transposed back into dQ rows, rounded once.
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t th = row / per_head, r = row % per_head;
      const std::int64_t tb = th / p.heads, h = th % p.heads;
      const auto [b, in_seq] = sequence_of(tb, r);
      const Sequence& s = seqs[static_cast<std::size_t>(b)];
      // Its row within the sequence (a dense batch's rows start at q_rows' begin).
      const std::int64_t i = p.varlen() ? in_seq : in_seq - s.q0;
      float* buf = mine;
      if (i < 0 || i >= s.seq) {
        std::fill(buf, buf + D, 0.0f);  // outside the sequence's rows
      } else {
        const float* tile = job.dq_acc + ((s.qb0 + i / kBlockQ) * p.heads + h) * D * kBlockQ + i % kBlockQ;
        for (std::int64_t d = 0; d < D; ++d) buf[d] = tile[d * kBlockQ];
      }
      store_row(grads.dq, tb, h, r, D, buf);
    }
  }
  // dK and dV rows outside a sequence's key rows: no item stores them.
  zero_outside_rows(grads.dk, seq_rows, /*queries=*/false);
  zero_outside_rows(grads.dv, seq_rows, /*queries=*/false);
}

}  // namespace attnprof::cpu::flash
