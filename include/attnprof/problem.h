// The attention problem: sizes, dtype, device, mask, scale and soft cap.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/batch_layout.h"
#include "attnprof/dtype.h"
#include "attnprof/mask.h"
#include "attnprof/tensor.h"

namespace attnprof {

std::string_view mask_name(MaskKind m);
// Takes '_' for '-' too ("sliding_window", as a Python keyword value is spelled).
std::optional<MaskKind> parse_mask(std::string_view name);
// The accepted spellings, for --help and error messages.
std::string_view mask_choices();
// The same with each mask's gloss, for --help: "none, causal (top-left,
// PyTorch's is_causal), ...".
std::string_view mask_help();

// Which pass a run times. Backward is timed with the forward's saved tensors
// already in place; Train is one step, the forward then the backward.
enum class Pass : std::uint8_t { Forward, Backward, Train };
std::string_view pass_name(Pass p);
std::optional<Pass> parse_pass(std::string_view name);

// How K and V are stored. Contiguous: [B, Hkv, Skv, D]. Paged: pages
// [num_pages, Hkv, page_size, D] and an int32 block table [B, pages_per_seq]
// mapping each sequence's logical page to a physical one (vLLM's layout).
enum class KvCache : std::uint8_t { Contiguous, Paged };
std::string_view kv_cache_name(KvCache c);
std::optional<KvCache> parse_kv_cache(std::string_view name);
// The accepted spellings, for --help and error messages.
std::string_view kv_cache_choices();

struct Problem {
  std::int64_t batch = 8;
  std::int64_t heads = 16;
  std::int64_t kv_heads = 0;  // 0: same as heads; fewer for grouped/multi-query attention
  std::int64_t seq = 1024;
  std::int64_t kv_seq = 0;  // 0: same as seq
  std::int64_t head_dim = 64;
  // Q, K and V's dtype; O (and the gradients) are output_dtype(dtype): the
  // same, except bf16 for fp8 (e4m3 inputs with Inputs' descales).
  DType dtype = DType::BF16;
  Device device = Device::Cpu;
  MaskKind mask = MaskKind::Causal;
  std::int64_t window = 0;      // SlidingWindow only
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  // Soft-capping (Gemma-2's logits): the scaled scores s become
  // tanh(s / softcap) * softcap before the mask. 0: no cap; else positive.
  double softcap = 0;
  Pass pass = Pass::Forward;
  // Backward only: dQ accumulated in a fixed order rather than with atomics
  // (fused backwards); refused where it means nothing.
  bool deterministic = false;
  KvCache kv_cache = KvCache::Contiguous;
  // Paged only: keys per page, a power of two. The last page of a sequence
  // is padded when kv_seq is not a multiple (pages round up).
  std::int64_t page_size = 0;
  // A packed (variable-length) batch, as FlashAttention's varlen functions
  // take one: empty = dense. Otherwise `batch` sequences, sequence b of
  // seq_lens[b] queries and kv_seq_lens[b] keys (0 allowed), laid end to end:
  // Q [total_q, H, D], K and V [total_kv, Hkv, D], held as the 4-d views
  // [1, H, total_q, D] and [1, Hkv, total_kv, D] (q_dims(), kv_dims()); O,
  // dO and the gradients likewise, the saved log-sum-exp [1, H, total_q, 1].
  // seq and kv_seq are max_seqlen_q and max_seqlen_k: at least every length.
  // The mask applies per sequence (causal, bottom-right and the window at
  // each sequence's own diagonal); grouped-query heads too. Structural masks
  // only, contiguous K and V only. kv_seq_lens empty: the same as seq_lens.
  std::vector<std::int64_t> seq_lens;
  std::vector<std::int64_t> kv_seq_lens;
  // A packed batch whose lengths the host never reads: seq_lens stays empty
  // and Inputs::cu_seqlens_q and _k, the caller's device tensors, are read
  // only by the kernels, in the caller's stream order (a GPU's flash; the
  // others read the lengths on the host first, Traits::device_lengths).
  // `batch` sequences lie end to end in packed_total_q query rows and
  // packed_total_kv key rows, each of at most seq queries and kv_seq keys
  // (max_seqlen_q and _k, or the totals when not given). The per-sequence
  // counts (visible_pairs, flops, bytes, seq_len(b)) are then the padded
  // batch's, upper bounds.
  bool lengths_on_device = false;
  std::int64_t packed_total_q = 0;
  std::int64_t packed_total_kv = 0;

  // Pages per sequence, ceil(kv_seq / page_size) (0 for a contiguous cache).
  std::int64_t pages_per_seq() const { return page_size > 0 ? (kv_seq + page_size - 1) / page_size : 0; }

  // Everything that decides how a problem runs: the plan caches' key.
  auto operator<=>(const Problem&) const = default;

  // Fills kv_heads/kv_seq defaults (and a packed batch's kv_seq_lens, kv_seq).
  Problem& normalize();
  // Throws Error(InvalidArgument) saying what to change, in field names
  // ("head_dim must be ..."), the fields listed in Error::fields().
  void validate() const;
  void validate_kv_cache() const;  // the kv_cache and page_size part of validate()
  void validate_varlen() const;    // the seq_lens and kv_seq_lens part of validate()
  void validate_host_lengths() const;
  void validate_device_lengths() const;

  // The batch layout the problem alone says: packed (varlen()), paged
  // (kv_cache Paged, no per-run key counts) or dense, with its mask's band.
  // A call's rows make it padded: layout_of(p, inputs), attnprof/batch_layout.h.
  BatchLayout layout() const;

  // ---- Packed (variable-length) batches; dense problems answer as one ----
  bool varlen() const { return !seq_lens.empty() || lengths_on_device; }
  // Queries and keys of sequence b: seq_lens[b] and kv_seq_lens[b], or seq and
  // kv_seq (also the bounds of a batch whose lengths are on the device).
  std::int64_t seq_len(std::int64_t b) const;
  std::int64_t kv_seq_len(std::int64_t b) const;
  // Query rows and key rows of the whole batch: the packed tensors' lengths
  // (batch * seq and batch * kv_seq when dense).
  std::int64_t total_q() const;
  std::int64_t total_kv() const;
  // The cumulative lengths, batch + 1 entries from 0 (cu_seqlens_q, _k):
  // sequence b's rows start at [b] in the packed tensor. Internal error when
  // the lengths are on the device.
  std::vector<std::int64_t> cu_seqlens_q() const;
  std::vector<std::int64_t> cu_seqlens_k() const;
  // Sequence b alone as a dense problem (batch 1, its lengths as seq and
  // kv_seq, everything else p's); the per-sequence loops run it (never on a
  // batch whose lengths are on the device: an internal error).
  Problem sequence(std::int64_t b) const;
  // The dense batch a padded call would run: batch sequences of seq and
  // kv_seq; p itself when dense.
  Problem padded() const;
  // Q's (and O's) and K's (and V's) 4-d sizes: [B, H, S, D] and
  // [B, Hkv, Skv, D], or the packed [1, H, total_q, D] and [1, Hkv, total_kv, D].
  Dims q_dims() const;
  Dims kv_dims() const;

  double softmax_scale() const;
  std::int64_t group() const { return heads / kv_heads; }

  // Structural masks only (None, causal, sliding window); Boolean and Bias
  // read their tensors.
  bool visible(std::int64_t i, std::int64_t j) const;
  // Number of visible (query, key) pairs per head for structural masks,
  // seq*kv_seq for Boolean and Bias. A packed batch: the sum over its
  // sequences, each at its own lengths (the whole batch's pairs per head).
  std::int64_t visible_pairs() const;
  // Matrix-product FLOPs of one forward: 4 * B * H * visible pairs * D
  // (4 * H * visible pairs * D for a packed batch: exact per sequence).
  double forward_flops() const;
  // FLOPs of one call of the pass: the forward's, 2.5x it for the backward
  // (five matrix products to the forward's two), 3.5x for a training step.
  double flops() const;
  // Bytes of dQ, dK and dV, or of O and dO: what a backward reads and writes
  // beyond Q, K and V.
  std::size_t gradient_bytes() const;
  // Key (and value) rows some query sees: the rows a kernel must read. All
  // kv_seq of them unless a structural mask hides some from every query (a
  // sliding window over a long cache; a top-left causal mask with kv_seq > seq).
  // A packed batch: the sum over its sequences.
  std::int64_t kv_rows_read() const;
  // The least one call of the pass must move through memory, in bytes: each
  // tensor read or written once, no re-reads, no scratch (the roofline's
  // denominator, FLOPs over these bytes its arithmetic intensity).
  // Q, K and V count in the input dtype (a byte an element for fp8), O and
  // dO and a bias in the output's (bf16 for fp8).
  //  forward:  Q read, K and V read (kv_rows_read() rows per sequence and K/V
  //            head: with a paged cache the rows, never the last page's
  //            padding), O written; a Boolean mask or a bias read once at its
  //            smallest shape, [S, Skv]; a paged cache's block table (an int32
  //            per page).
  //  backward: what a fused backward must at least move: Q, K, V, O, dO and
  //            the row log-sum-exp read, dQ, dK and dV written (all of them),
  //            the mask read.
  //  train:    the forward, which also writes the log-sum-exp it saves, then
  //            the backward.
  std::size_t io_bytes() const;
  // The row log-sum-exp a fused forward saves for the backward: FP32, one per
  // (batch, head, query row).
  std::size_t lse_bytes() const;
  // Rows whose every key is masked (structural masks only); per (batch, head),
  // or summed over a packed batch's sequences.
  std::int64_t fully_masked_rows() const;

  // "8_16_1024_64": the file-name stem.
  std::string shape_key() const;
  // The stem of the files a run writes: shape_key(), then the pass when it is
  // not the forward, the soft cap and the paged cache, so that runs of one
  // shape with another pass, cap or cache do not overwrite each other
  // ("8_16_1024_64_backward", "8_16_1024_64_softcap30"), and "_fp8" for FP8
  // inputs; a packed batch adds "_varlen", its query rows and a hash of its
  // lengths.
  std::string file_stem() const;
  std::string describe() const;  // "batch 8, heads 16, seq 1024, head_dim 64, bf16, causal on cuda"
  std::size_t q_bytes() const;
  // O's bytes, in output_dtype(dtype): Q's size, but bf16 for fp8 inputs.
  std::size_t o_bytes() const;
  std::size_t kv_bytes() const;  // one of K or V
  // A paged cache's copy of one of K or V (the last pages' padding included)
  // plus its share of the block table; 0 for a contiguous cache.
  std::size_t kv_page_bytes() const;
};

// A packed batch of `base`'s heads, head_dim, dtype, mask ...: sequence b has
// seq_lens[b] queries and kv_seq_lens[b] keys (empty: seq_lens), batch their
// count, seq and kv_seq their maxima. Not validated here.
Problem varlen_problem(Problem base, std::vector<std::int64_t> seq_lens, std::vector<std::int64_t> kv_seq_lens = {});

// Per-sequence lengths from FlashAttention's cumulative lengths (`name`:
// "cu_seqlens_q" in messages): n >= 2 entries starting at 0, never
// decreasing, the last equal to `total` (the packed tensor's rows). Throws
// Error(InvalidArgument) with one line saying which entry is wrong.
std::vector<std::int64_t> lengths_from_cu_seqlens(const std::int32_t* cu, std::size_t n, std::int64_t total,
                                                  std::string_view name);

}  // namespace attnprof
