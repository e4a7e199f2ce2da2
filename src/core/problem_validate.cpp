// Problem::validate() and its parts (the paged cache, the packed batch), and
// the check of a packed batch's cumulative lengths: every refusal of a problem
// before anything is sized from it, each one line (ErrorKind::InvalidArgument
// with the fields to change). The geometry and sizes are problem.cpp's.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/limits.h"
#include "attnprof/problem.h"
#include "core/problem_detail.h"

namespace attnprof {
namespace {

using problem_detail::format_real;
using problem_detail::sum_of;

// Limits that catch typos (a seq of 10^9) before anything is sized from them.
using limits::kMaxSeq;
constexpr std::int64_t kMaxBatchHeads = std::int64_t{1} << 20;
constexpr std::int64_t kMaxHeadDim = 256;
// The [B, H, S, Skv] scores an unfused backend materialises: byte counts of a
// dozen FP32 buffers of them (and the float64 reference's) stay exact in 64
// bits below this. The other limits alone allow 2^64 of them.
constexpr std::int64_t kMaxScores = std::int64_t{1} << 56;

[[noreturn]] void refuse(const std::string& message, std::vector<std::string> fields) {
  fail(ErrorKind::InvalidArgument, message, std::move(fields));
}

void require_positive(std::int64_t v, const char* field) {
  if (v <= 0) refuse(std::string(field) + " must be positive, got " + std::to_string(v), {field});
}

// The product of non-negative sizes, or nullopt past int64.
std::optional<std::int64_t> product(std::initializer_list<std::int64_t> sizes) {
  std::int64_t n = 1;
  for (const std::int64_t s : sizes) {
    if (__builtin_mul_overflow(n, s, &n)) return std::nullopt;
  }
  return n;
}

}  // namespace

void Problem::validate() const {
  require_positive(batch, "batch");
  require_positive(heads, "heads");
  require_positive(kv_heads, "kv_heads");
  // Before seq and kv_seq: a packed batch's are its longest lengths, so a
  // wrong length is named as the length it is (all 0 leaves seq 0).
  validate_varlen();
  require_positive(seq, "seq");
  require_positive(kv_seq, "kv_seq");
  require_positive(head_dim, "head_dim");
  for (const auto& [v, field] : {std::pair{seq, "seq"}, std::pair{kv_seq, "kv_seq"}}) {
    if (v > kMaxSeq) {
      refuse(std::string(field) + " " + std::to_string(v) + " is beyond the " + std::to_string(kMaxSeq) +
                 " this tool accepts",
             {field});
    }
  }
  if (batch > kMaxBatchHeads || heads > kMaxBatchHeads || batch * heads > kMaxBatchHeads) {  // no overflow
    refuse("batch x heads is beyond the " + std::to_string(kMaxBatchHeads) + " query heads this tool accepts",
           {"batch", "heads"});
  }
  if (head_dim > kMaxHeadDim) {
    refuse("head_dim " + std::to_string(head_dim) + " is above the largest supported, " + std::to_string(kMaxHeadDim),
           {"head_dim"});
  }
  if (kv_heads > heads || heads % kv_heads != 0) {
    refuse("kv_heads " + std::to_string(kv_heads) + " must divide heads " + std::to_string(heads) +
               " (grouped-query attention)",
           {"kv_heads", "heads"});
  }
  // Within the limits above Q, K and V count at most 2^50 elements; the
  // scores can pass 2^63 (a size_t of bytes, 2^64).
  if (const auto scores = product({batch, heads, seq, kv_seq}); !scores || *scores > kMaxScores) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g",
                  static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(seq) *
                      static_cast<double>(kv_seq));
    refuse("batch x heads x seq x kv_seq is " + std::string(buf) + " attention scores, beyond the 2^56 (" +
               std::to_string(kMaxScores) + ") this tool sizes in 64-bit byte counts",
           {"batch", "heads", "seq", "kv_seq"});
  }
  if (dtype == DType::Bool || dtype == DType::I32) refuse("dtype must be fp32, fp16, bf16 or fp8", {"dtype"});
  // FP8 (e4m3 inputs with descales, bf16 output) is an inference format
  // here, as FlashAttention-3's and cuDNN's FP8 forwards are: no backward.
  if (is_fp8(dtype) && pass != Pass::Forward) {
    refuse("dtype fp8 is forward only (e4m3 inputs, bf16 output): use pass=forward, or dtype bf16 to train",
           {"pass", "dtype"});
  }
  if (mask == MaskKind::SlidingWindow && window <= 0) {
    refuse("mask=sliding-window needs window=N (N >= 1 keys)", {"window"});
  }
  if (mask != MaskKind::SlidingWindow && window != 0) {
    refuse("window applies only to mask=sliding-window", {"window"});
  }
  if (deterministic && pass == Pass::Forward) {
    refuse("deterministic applies to the backward (pass=backward or train): the forward has no atomics to order",
           {"deterministic"});
  }
  validate_kv_cache();
  if (scale && (!std::isfinite(*scale) || *scale == 0.0)) refuse("scale must be a finite, non-zero number", {"scale"});
  // 0 is no cap; anything else, from Python, the CLI or code, lies in the range.
  if (!limits::softcap_in_range(softcap, dtype)) {
    refuse("softcap must be a finite number from 2^-60 to " +
               std::string(limits::softcap_max(dtype) == limits::kSoftcapMax ? "2^60" : "2^10 for fp16") +
               " (0: no cap), got " + format_real(softcap),
           {"softcap"});
  }
  // The inputs are uniform in [-1, 1), so |q . k| reaches head_dim at most and
  // a score |scale| x head_dim. Past the scores' dtype's largest finite value
  // the unfused backends' scores become inf and softmax gives NaN (inf - inf);
  // the fused ones and the float64 reference soon follow. Refused before any
  // work. FP8's real inputs are the same (the descales carry the range, not
  // e4m3's 448), and every FP8 path holds its scores in FP32: the composites
  // after dequantizing, the fused kernels in their accumulators.
  const DType scores = is_fp8(dtype) ? DType::F32 : dtype;
  if (const double reach = std::abs(softmax_scale()) * static_cast<double>(head_dim); reach > max_finite(scores)) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "scale %g makes the scores overflow: |scale| x head_dim reaches %.3g, past the largest finite %s "
                  "(%.5g), so softmax would give NaN everywhere; use |scale| <= %.3g",
                  softmax_scale(), reach, std::string(dtype_name(scores)).c_str(), max_finite(scores),
                  max_finite(scores) / static_cast<double>(head_dim));
    refuse(buf, {"scale", "head_dim"});
  }
  // Then the range every backend computes correctly (attnprof/limits.h says
  // why); a scale past the scores' reach is named as that overflow above.
  if (scale && !limits::scale_in_range(*scale)) {
    refuse(
        "scale must lie between 2^-60 and 2^60 in magnitude (the kernels hold it and its products in FP32), "
        "got " +
            format_real(*scale),
        {"scale"});
  }
}

// The paged cache: a page size that is a power of two (as vLLM's and
// FlashAttention's kernels take), with kv_cache=paged only, forward only.
void Problem::validate_kv_cache() const {
  if (kv_cache != KvCache::Paged) {
    if (page_size != 0) refuse("page_size applies only to kv_cache=paged", {"page_size"});
    return;
  }
  if (page_size <= 0) {
    refuse("kv_cache=paged needs page_size=N (keys per page, a power of two such as 16)", {"page_size"});
  }
  if (page_size > kMaxSeq) {
    refuse("page_size " + std::to_string(page_size) + " is beyond the " + std::to_string(kMaxSeq) +
               " keys this tool accepts",
           {"page_size"});
  }
  if ((page_size & (page_size - 1)) != 0) {
    refuse("page_size " + std::to_string(page_size) + " must be a power of two (16, 32, 64 ...)", {"page_size"});
  }
  if (pass != Pass::Forward) {
    refuse("kv_cache=paged is forward only (a decode-time cache): use pass=forward, or kv_cache=contiguous", {});
  }
}

// A packed batch: a length per sequence for queries and keys, none negative,
// the maxima within seq and kv_seq (max_seqlen_q, max_seqlen_k), some query
// and some key in all; a structural mask and a contiguous cache.
void Problem::validate_varlen() const {
  if (!varlen()) {
    if (!kv_seq_lens.empty()) {
      refuse("kv_seq_lens needs seq_lens (a packed batch's query lengths)", {"kv_seq_lens", "seq_lens"});
    }
    return;
  }
  if (lengths_on_device) {
    validate_device_lengths();
  } else {
    validate_host_lengths();
  }
  if (mask == MaskKind::Boolean || mask == MaskKind::Bias) {
    refuse(
        "a packed batch (seq_lens) takes structural masks only (none, causal, causal-bottom-right, "
        "sliding-window): its mask is per sequence",
        {"seq_lens", "mask"});
  }
  if (kv_cache == KvCache::Paged) {
    refuse("a packed batch (seq_lens) reads a contiguous K and V: use kv_cache=contiguous", {"seq_lens"});
  }
}

// Lengths the host never reads: the shapes alone (the kernels clamp each
// sequence's rows into the totals and the maxima, and flag what they clamp).
void Problem::validate_device_lengths() const {
  if (!seq_lens.empty() || !kv_seq_lens.empty()) {
    refuse("a packed batch has its lengths on the host (seq_lens) or on the device (cu_seqlens), not both",
           {"seq_lens"});
  }
  for (const auto& [total, rows, max, max_name, field] :
       {std::tuple{packed_total_q, "query", seq, "max_seqlen_q", "seq"},
        std::tuple{packed_total_kv, "key", kv_seq, "max_seqlen_k", "kv_seq"}}) {
    if (total < 1) refuse(std::string("the packed batch has no ") + rows + " rows", {field});
    if (max < 1 || max > total) {
      refuse(std::string(max_name) + " is " + std::to_string(max) + ": from 1 to the packed batch's " + rows +
                 " rows (" + std::to_string(total) + ")",
             {field});
    }
  }
}

void Problem::validate_host_lengths() const {
  const std::vector<std::int64_t>& kv = kv_seq_lens.empty() ? seq_lens : kv_seq_lens;
  for (const auto& [lens, field, max_field, max] :
       {std::tuple{&seq_lens, "seq_lens", "seq", seq}, std::tuple{&kv, "kv_seq_lens", "kv_seq", kv_seq}}) {
    if (static_cast<std::int64_t>(lens->size()) != batch) {
      refuse(std::string(field) + " has " + std::to_string(lens->size()) + " lengths but batch is " +
                 std::to_string(batch) + " (one length per sequence)",
             {field, "batch"});
    }
    for (std::size_t b = 0; b < lens->size(); ++b) {
      const std::int64_t n = (*lens)[b];
      if (n < 0) {
        refuse(std::string(field) + "[" + std::to_string(b) + "] is " + std::to_string(n) + ": lengths are 0 or more",
               {field});
      }
      if (n > max) {
        refuse(std::string(max_field) + " (the maximum length) is " + std::to_string(max) + ", smaller than " + field +
                   "[" + std::to_string(b) + "] = " + std::to_string(n),
               {max_field, field});
      }
    }
    if (sum_of(*lens) <= 0) refuse(std::string(field) + " are all 0: the packed batch has no rows", {field});
  }
}
std::vector<std::int64_t> lengths_from_cu_seqlens(const std::int32_t* cu, std::size_t n, std::int64_t total,
                                                  std::string_view name) {
  const std::string what(name);
  if (n < 2) {
    refuse(what + " has " + std::to_string(n) + " entries: it needs batch + 1 >= 2 (0, then each sequence's end)",
           {what});
  }
  if (cu[0] != 0) refuse(what + "[0] is " + std::to_string(cu[0]) + ": cumulative lengths start at 0", {what});
  std::vector<std::int64_t> lens;
  lens.reserve(n - 1);
  for (std::size_t i = 1; i < n; ++i) {
    if (cu[i] < cu[i - 1]) {
      refuse(what + " decreases at entry " + std::to_string(i) + " (" + std::to_string(cu[i - 1]) + " then " +
                 std::to_string(cu[i]) + "): cumulative lengths never decrease",
             {what});
    }
    if (cu[i] > total) {
      refuse(what + "[" + std::to_string(i) + "] = " + std::to_string(cu[i]) + " overruns the packed tensor's " +
                 std::to_string(total) + " rows",
             {what});
    }
    lens.push_back(static_cast<std::int64_t>(cu[i]) - cu[i - 1]);
  }
  if (cu[n - 1] != total) {
    refuse(what + " ends at " + std::to_string(cu[n - 1]) + " but the packed tensor has " + std::to_string(total) +
               " rows: the last entry is the total",
           {what});
  }
  return lens;
}

}  // namespace attnprof
