// flash on the CPU: FlashAttention's tiled online softmax. Each work item is
// one (batch, head, block of query rows: kBlockQ, or twice that where the
// kernels' forward_block_rows says); it walks the visible key
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
//
// What the forward and the backward share (the band, each sequence's rows, row
// loads and stores, the masking of a block) is flash_tiles.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/aliasing.h"
#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/flash_kernels.h"
#include "backends/cpu/flash_tiles.h"
#include "backends/cpu/ops.h"
#include "core/mask_lowering.h"

namespace attnprof::cpu {

namespace flash {

const Kernels& kernels_of(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar:
      return kKernelsScalar;
    case CpuIsa::Avx2:
      return kKernelsAvx2;
    case CpuIsa::Avx512:
      return kKernelsAvx512;
    case CpuIsa::Avx512Bf16:
      return kKernelsAvx512Bf16;
    case CpuIsa::Amx:
      return kKernelsAmx;
  }
  return kKernelsScalar;
}

namespace {
const Kernels* g_test_kernels = nullptr;
}  // namespace

const Kernels& kernels_for_run(CpuIsa isa) { return g_test_kernels ? *g_test_kernels : kernels_of(isa); }
void set_kernels_for_testing(const Kernels* kernels) { g_test_kernels = kernels; }

}  // namespace flash

namespace {

using namespace flash;

// What a packed batch adds to the eligibility's story.
std::string packed(const Problem& p) {
  if (!p.varlen()) return {};
  // Where some but not all decode (every one: the kernel's sentence says so).
  const std::string decoding =
      may_decode(p) && !decodes(p) && p.pass != Pass::Backward
          ? " (those of at most " + std::to_string(kDecodeQueries) + " queries decoded: each KV head's keys read once)"
          : "";
  return ", " + std::to_string(p.batch) + " packed sequences, each against its own keys" + decoding;
}

class FlashCpu final : public Backend {
 public:
  std::string_view name() const override { return "flash"; }
  Device device() const override { return Device::Cpu; }

  Eligibility eligibility(const Problem& p) const override {
    if (std::string why = check_problem(p); !why.empty()) return {.eligible = false, .reason = why};
    const IsaChoice isa = choose_isa();
    if (!isa.error.empty()) return {.eligible = false, .reason = isa.error};
    const std::string threads = std::to_string(omp_get_max_threads()) + " threads";
    char cap_buf[64] = "";
    if (p.softcap > 0) std::snprintf(cap_buf, sizeof cap_buf, ", scores soft-capped at %g per key block", p.softcap);
    const std::string cap = cap_buf;
    const std::string kernel = kernel_story(isa, p);
    if (p.pass == Pass::Forward) {
      const std::string paged =
          p.kv_cache == KvCache::Paged ? ", K and V read from their pages through the block table" : "";
      const std::string lowered =
          p.mask == MaskKind::Boolean
              ? ", a key-padding mask lowered to per-sequence key rows (others read per element)"
              : "";
      const std::string fp8 = is_fp8(p.dtype)
                                  ? ", e4m3 inputs read as they are stored (q's and k's descales in the scale, "
                                    "v's on O)"
                                  : "";
      return {.eligible = true,
              .reason = "tiled online softmax, " + threads + cap + paged + lowered + packed(p) + fp8 +
                        ", never materialises [S, Skv]; " + kernel};
    }
    return {.eligible = true,
            .reason = "FlashAttention-2 backward recomputing P from the saved log-sum-exp, " + threads + cap +
                      packed(p) + (p.deterministic ? ", dQ summed in a fixed order" : "") +
                      ", never materialises [S, Skv]; " + kernel};
  }

  // "flash cpu kernel: avx2 (no avx512f): <the products>", the forward's and,
  // for a backward or training pass, the backward's.
  static std::string kernel_story(const IsaChoice& isa, const Problem& problem) {
    Problem p = problem;
    p.normalize();
    const Kernels& k = kernels_for_run(isa.isa);
    std::string s = "flash cpu kernel: " + isa.why + ": ";
    if (p.pass == Pass::Backward) return s + "backward " + k.backward_products(p);
    s += k.forward_products(p);
    if (p.pass == Pass::Train) s += std::string("; backward ") + k.backward_products(p);
    return s;
  }

  std::size_t workspace_bytes(const Problem& problem) const override {
    Problem p = problem;
    p.normalize();
    const IsaChoice isa = choose_isa();
    const Kernels& k = kernels_for_run(isa.isa);
    const int threads = omp_get_max_threads();
    const std::size_t forward =
        static_cast<std::size_t>(k.forward_scratch_floats(p)) * sizeof(float) * static_cast<std::size_t>(threads);
    if (p.pass == Pass::Forward) return forward;
    return forward + p.lse_bytes() + backward_workspace_bytes(p, threads);
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
        .backward_recomputes = true,
        .backward_dq_unordered = true,
        .softcap = true,
        .rows = true,
        .varlen = true,
        .fp8 = true,
        .paged = true,
        .paged_lengths = true,
    };
  }

  void forward(const Problem& problem, const Inputs& in, Tensor& out, RunContext& ctx) override {
    run_forward(problem, in, out, nullptr, ctx);
  }

  // A plan's forwards (attnprof/plan.h) share one per-thread scratch, made
  // here for the kernels and threads the plan will run with, instead of one
  // allocated by every forward.
  std::unique_ptr<BackendState> prepare(const Problem& problem, RunContext& ctx) override {
    Problem p = problem;
    p.normalize();
    const IsaChoice isa = choose_isa();
    if (!isa.error.empty()) return nullptr;  // the forward refuses, naming it
    auto s = std::make_unique<Scratch>();
    s->kernels = &kernels_for_run(isa.isa);
    s->threads = resolve_threads(ctx.threads);
    s->per_thread = s->kernels->forward_scratch_floats(p);
    s->buffer = Tensor::empty({s->threads, 1, 1, s->per_thread}, DType::F32, ctx.allocator);
    // The decode ranges' partial results, for the longest sequence's ranges in every sequence and KV head
    // (each sequence sees at most kv_seq keys).
    const std::int64_t chunks = (p.kv_seq + kDecodeChunkKeys - 1) / kDecodeChunkKeys;
    if (may_decode(p) && chunks > 1) {
      s->partials =
          Tensor::empty({1, 1, 1, p.batch * p.kv_heads * chunks * decode_partial_floats(p)}, DType::F32, ctx.allocator);
    }
    return s;
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
  // prepare()'s state: `threads` scratches of `per_thread` floats for
  // `kernels` (a forward whose kernels, sizing or thread count differ, as
  // after the OpenMP count grew, allocates its own).
  struct Scratch final : BackendState {
    const Kernels* kernels = nullptr;
    int threads = 0;
    std::int64_t per_thread = 0;
    Tensor buffer;
    Tensor partials;  // the decode ranges' partial results (undefined: none)
    std::size_t bytes() const override { return buffer.nbytes() + (partials.defined() ? partials.nbytes() : 0); }
  };

  static void run_forward(const Problem& problem, const Inputs& in, Tensor& out, float* lse, RunContext& ctx) {
    Problem p = problem;
    p.normalize();
    RecordFunction rf("flash_attention", dtypes_string({&in.q, &in.k, &in.v}),
                      dims_string(in.q) + ", " + dims_string(in.k) + ", " + dims_string(in.v));
    require_mask_tensor(p, in);
    require_output_apart(in, out, "flash");
    if (p.kv_cache == KvCache::Paged && (!in.k_pages.defined() || !in.v_pages.defined() || !in.block_table.defined())) {
      fail(ErrorKind::InvalidArgument,
           "flash: kv_cache=paged without the pages and block table (make_inputs makes them)");
    }
    // Per-sequence rows: the caller's (q_rows, kv_rows), or a key-padding
    // mask's key rows (rows take no tensor mask: sequence_rows refuses both).
    std::vector<SequenceRows> seq_rows = sequence_rows(p, in);
    if (p.varlen()) require_shapes(p, in, "flash");
    // The pages each sequence reads (a prefix cache's tables share pages,
    // and outside its pages a row is not read).
    if (p.kv_cache == KvCache::Paged) {
      std::vector<std::int32_t> pairs;
      for (const SequenceRows& r : seq_rows) {
        pairs.insert(pairs.end(), {static_cast<std::int32_t>(r.k.begin), static_cast<std::int32_t>(r.k.end)});
      }
      check_block_table_reads(p, in.block_table, in.k_pages.size(0), seq_rows.empty() ? nullptr : pairs.data());
    }
    const std::optional<std::vector<RowSpan>> lowered =
        p.mask == MaskKind::Boolean ? key_padding_rows(in.mask) : std::nullopt;
    if (lowered) {
      seq_rows.resize(lowered->size());
      for (std::size_t b = 0; b < seq_rows.size(); ++b)
        seq_rows[b] = {.q = {0, p.seq}, .k = {(*lowered)[b].begin, (*lowered)[b].end}};
    }
    // Each sequence's rows and band: the bottom-right alignment
    // (CausalBottomRight, SlidingWindow) is then the sequence's own.
    const std::vector<Sequence> seqs = sequences_of(p, seq_rows);
    clear_outside_rows(p, seq_rows, out, lse);

    // The kernels of the level cpu_isa.h picks: never one this CPU lacks.
    const IsaChoice isa = choose_isa();
    if (!isa.error.empty()) fail(ErrorKind::Unsupported, "flash: " + isa.error);
    const Kernels& kernels = kernels_for_run(isa.isa);

    const std::int64_t D = p.head_dim;
    // A paged cache's rows are copied out of their pages (load_kv_row).
    const bool paged = p.kv_cache == KvCache::Paged;
    // FP8: the kernels multiply the stored e4m3 values (flash_bf16_kernels.h);
    // q's and k's descales join the scores' scale and v's multiplies O.
    const bool fp8 = is_fp8(p.dtype);
    // Descale tensors are for a GPU's kernels (attnprof/backend.h); the CPU's
    // callers hold the numbers (the bindings read a host tensor's value).
    if (fp8 && in.device_descales()) {
      fail(ErrorKind::InvalidArgument,
           "flash on the CPU takes fp8 descales as numbers (Inputs::q_descale ...), "
           "not descale tensors");
    }
    const double qk_descale = fp8 ? double{in.q_descale} * double{in.k_descale} : 1.0;
    const ForwardJob job{.p = p,
                         .in = in,
                         .out = out,
                         .q_scale = static_cast<float>(p.softmax_scale() * std::numbers::log2e * qk_descale),
                         .cap2 = static_cast<float>(p.softcap * std::numbers::log2e),
                         .o_scale = fp8 ? in.v_descale : 1.0f,
                         .k_unit = !paged && (in.k.stride(3) == 1 || D == 1),
                         .v_unit = !paged && (in.v.stride(3) == 1 || D == 1),
                         .lse = lse,
                         .seqs = seqs,
                         .lse_rows = lse_rows(p),
                         .mask_lowered = lowered.has_value()};

    // Decoding: one item per (sequence, KV head, key range), its query heads
    // together (flash_decode_kernels.h), for each sequence of a few queries;
    // the others take the tiled items. Per sequence (flash_tiles.h's
    // decodes() says why), so a packed batch or a caller's rows run each
    // sequence as its own dense call would. A sequence of several key ranges
    // (decode_chunks) leaves each range's partial result in `partials`, and
    // one merge per (sequence, KV head) runs after every item.
    struct DecodeItem {
      std::int64_t b, hk, chunk, partial;  // partial: offset into partials, or -1 (the item stores its rows)
    };
    struct DecodeMerge {
      std::int64_t b, hk, chunks, partial;
    };
    std::vector<DecodeItem> decoding;
    std::vector<DecodeMerge> merges;
    std::vector<char> decoded(seqs.size(), 0);
    const std::int64_t partial_stride = decode_partial_floats(p);
    std::int64_t partial_floats = 0;
    bool any_tiled = false;
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      if (seqs[b].seq == 0) continue;  // nothing to compute (clear_outside_rows wrote its rows)
      if (!decodes(p, seqs[b].seq)) {
        any_tiled = true;
        continue;
      }
      decoded[b] = 1;
      const auto sb = static_cast<std::int64_t>(b);
      const std::int64_t chunks = decode_chunks(seqs[b]);
      for (std::int64_t hk = 0; hk < p.kv_heads; ++hk) {
        if (chunks > 1) merges.push_back({sb, hk, chunks, partial_floats});
        for (std::int64_t c = 0; c < chunks; ++c) {
          decoding.push_back({sb, hk, c, chunks > 1 ? partial_floats : -1});
          if (chunks > 1) partial_floats += partial_stride;
        }
      }
    }
    const auto decode_items = static_cast<std::int64_t>(decoding.size());

    // A packed batch's items run over its longest sequence's query blocks;
    // those past a shorter one's end, and a decoding sequence's, return at once.
    const std::int64_t rows = kernels.forward_block_rows(p);
    const std::int64_t q_blocks = any_tiled ? (p.seq + rows - 1) / rows : 0;
    const std::int64_t heads = p.batch * p.heads;
    const std::int64_t items = heads * q_blocks;
    const int threads = static_cast<int>(
        std::min<std::int64_t>(resolve_threads(ctx.threads), std::max<std::int64_t>(items + decode_items, 1)));

    // Sized for either item (forward_scratch_floats covers both where p may decode).
    const std::int64_t per_thread = kernels.forward_scratch_floats(p);
    const auto* held = dynamic_cast<const Scratch*>(ctx.state);
    Tensor scratch;
    if (!(held && held->kernels == &kernels && held->per_thread == per_thread && held->threads >= threads)) {
      scratch = Tensor::empty({threads, 1, 1, per_thread}, DType::F32, ctx.allocator);
    }
    float* scratch_base = scratch.defined() ? scratch.data_as<float>() : held->buffer.data_as<float>();
    Tensor partial_buffer;
    float* partials = nullptr;
    if (partial_floats > 0) {
      if (held && held->partials.defined() && held->partials.numel() >= partial_floats) {
        partials = held->partials.data_as<float>();
      } else {
        partial_buffer = Tensor::empty({1, 1, 1, partial_floats}, DType::F32, ctx.allocator);
        partials = partial_buffer.data_as<float>();
      }
    }

    // Items run head by head; within a head the later query blocks, which
    // see more keys under causal masks, are handed out first (dynamic
    // schedule), so the last items to finish are the short ones. Where the
    // kernels repack a head's K and V once per thread that works on it (the
    // bf16 ones), every head has the same work (no per-sequence lengths) and
    // there are four heads a thread or more, a thread takes a head whole
    // (2x8x1024x64 causal on AMX: 14.4 -> 10.2 ms, docs/perf/cpu-flash.md);
    // the FP32 kernels read K and V in place and keep the finer schedule.
    const bool equal_heads = !p.varlen() && seq_rows.empty();
    const bool whole_heads = kernels.forward_repacks_heads(p) && equal_heads && heads >= 4 * threads;
    const std::int64_t chunk = whole_heads ? q_blocks : 1;
#pragma omp parallel num_threads(threads)
    {
      float* mine = scratch_base + static_cast<std::int64_t>(omp_get_thread_num()) * per_thread;
#pragma omp for schedule(dynamic, 1) nowait
      for (std::int64_t item = 0; item < decode_items; ++item) {
        const DecodeItem& d = decoding[static_cast<std::size_t>(item)];
        kernels.attend_decode(job, d.b, d.hk, d.chunk, mine, d.partial < 0 ? nullptr : partials + d.partial);
      }
      // No head's K and V held yet: set after this thread's decode items,
      // which write over the region the bf16 items keep them in.
      std::memset(mine, 0xff, kScratchHeaderFloats * sizeof(float));
#pragma omp for schedule(dynamic, chunk)
      for (std::int64_t item = 0; item < items; ++item) {
        const std::int64_t bh = item / q_blocks;
        const std::int64_t qb = q_blocks - 1 - item % q_blocks;
        if (decoded[static_cast<std::size_t>(bh / p.heads)]) continue;
        kernels.attend_block(job, bh / p.heads, bh % p.heads, qb * rows, mine);
      }
      // (The loop above ends at a barrier: every decode item is done.)
#pragma omp for schedule(dynamic, 1)
      for (std::size_t i = 0; i < merges.size(); ++i) {
        const DecodeMerge& g = merges[i];
        kernels.merge_decode(job, g.b, g.hk, g.chunks, partials + g.partial, partial_stride, mine);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_flash() { return std::make_unique<FlashCpu>(); }

}  // namespace attnprof::cpu
