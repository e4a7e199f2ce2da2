// A Problem's geometry and sizes (visible pairs, fully masked rows, FLOPs,
// bytes), its names, a packed batch's lengths, and the eligibility every
// backend shares. Its checks and their one-line errors are
// problem_validate.cpp's; its file stem and description problem_describe.cpp's.
#include "attnprof/problem.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <sstream>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "core/mask_geometry.h"
#include "core/problem_detail.h"

namespace attnprof {
namespace {

using problem_detail::max_of;
using problem_detail::sum_of;

// The mask table: the one source of the masks' names, the choices errors
// and --help list, and each one's gloss in the help.
struct MaskSpelling {
  MaskKind kind;
  std::string_view name;
  std::string_view gloss;  // what --help says after the name, if anything
};
constexpr MaskSpelling kMasks[] = {
    {.kind = MaskKind::None, .name = "none", .gloss = ""},
    {.kind = MaskKind::Causal, .name = "causal", .gloss = "top-left, PyTorch's is_causal"},
    {.kind = MaskKind::CausalBottomRight, .name = "causal-bottom-right", .gloss = "FlashAttention's"},
    {.kind = MaskKind::SlidingWindow, .name = "sliding-window", .gloss = ""},
    {.kind = MaskKind::Boolean, .name = "boolean", .gloss = "a random 90%-kept mask"},
    {.kind = MaskKind::Bias, .name = "bias", .gloss = "random additive"},
};

// The table's names joined by ", ", each with its gloss in parentheses when
// `glossed`.
std::string mask_list(bool glossed) {
  std::string s;
  for (const auto& m : kMasks) {
    if (!s.empty()) s += ", ";
    s += m.name;
    if (glossed && !m.gloss.empty()) {
      s += " (";
      s += m.gloss;
      s += ')';
    }
  }
  return s;
}

// Bytes of a tensor of these sizes, saturating at SIZE_MAX (validate() keeps
// every problem's tensors far below it).
std::size_t bytes_of(std::initializer_list<std::int64_t> sizes, std::size_t element) {
  std::size_t n = element;
  for (const std::int64_t s : sizes) {
    if (s < 0 || __builtin_mul_overflow(n, static_cast<std::size_t>(s), &n)) return SIZE_MAX;
  }
  return n;
}

std::size_t sum(std::initializer_list<std::size_t> parts) {
  std::size_t n = 0;
  for (const std::size_t x : parts) {
    if (__builtin_add_overflow(n, x, &n)) return SIZE_MAX;
  }
  return n;
}

// One sequence's lengths under the problem's mask: a dense problem's, or one
// sequence of a packed batch (mask_geometry.h's band at its own diagonal).
struct Geometry {
  MaskKind mask;
  geometry::Band<std::int64_t> band;
  std::int64_t seq, kv_seq;
};

Geometry geometry_of(const Problem& p, std::int64_t b) {
  const std::int64_t seq = p.seq_len(b), kv_seq = p.kv_seq_len(b);
  return {.mask = p.mask, .band = geometry::band_of(p.mask, p.window, seq, kv_seq), .seq = seq, .kv_seq = kv_seq};
}

// The counts walk the band row by row where it has a bound; None and the
// tensor masks count every pair (what a tensor hides is not known here).
std::int64_t visible_pairs_of(const Geometry& g) {
  if (!geometry::banded(g.mask)) return g.seq * g.kv_seq;
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < g.seq; ++i) total += geometry::keys_of_row(g.band, i, g.kv_seq).size();
  return total;
}

std::int64_t fully_masked_rows_of(const Geometry& g) {
  if (!geometry::banded(g.mask)) return 0;
  std::int64_t rows = 0;
  for (std::int64_t i = 0; i < g.seq; ++i) rows += geometry::keys_of_row(g.band, i, g.kv_seq).empty();
  return rows;
}

std::int64_t kv_rows_read_of(const Geometry& g) {
  if (!geometry::banded(g.mask)) return g.kv_seq;
  // Each row's keys are one range, and the ranges of consecutive rows move
  // by at most one key: their union is one range too, from the first row's
  // first key to the last row's last.
  if (g.seq == 0) return 0;
  return geometry::keys_of_rows(g.band, std::int64_t{0}, g.seq, g.kv_seq).size();
}

// A count over a packed batch's sequences, or the dense problem's one.
template <class Of>
std::int64_t over_sequences(const Problem& p, Of of) {
  if (!p.varlen()) return of(geometry_of(p, 0));
  std::int64_t total = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) total += of(geometry_of(p, b));
  return total;
}

}  // namespace

std::string_view mask_name(MaskKind m) {
  for (const auto& s : kMasks) {
    if (s.kind == m) return s.name;
  }
  return "?";
}

std::optional<MaskKind> parse_mask(std::string_view name) {
  std::string spelled(name);
  std::replace(spelled.begin(), spelled.end(), '_', '-');
  for (const auto& s : kMasks) {
    if (s.name == spelled) return s.kind;
  }
  if (spelled == "causal-top-left") return MaskKind::Causal;
  return std::nullopt;
}

std::string_view kv_cache_name(KvCache c) { return c == KvCache::Paged ? "paged" : "contiguous"; }

std::optional<KvCache> parse_kv_cache(std::string_view name) {
  if (name == "contiguous") return KvCache::Contiguous;
  if (name == "paged") return KvCache::Paged;
  return std::nullopt;
}

std::string_view kv_cache_choices() { return "contiguous, paged"; }

std::string_view mask_choices() {
  static const std::string choices = mask_list(/*glossed=*/false);
  return choices;
}

std::string_view mask_help() {
  static const std::string help = mask_list(/*glossed=*/true);
  return help;
}

Problem& Problem::normalize() {
  if (kv_heads == 0) kv_heads = heads;
  if (varlen() && kv_seq_lens.empty()) kv_seq_lens = seq_lens;
  if (kv_seq == 0) kv_seq = varlen() ? max_of(kv_seq_lens) : seq;
  return *this;
}

double Problem::softmax_scale() const { return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }

bool Problem::visible(std::int64_t i, std::int64_t j) const {
  return geometry::visible(geometry_of(*this, 0).band, i, j);
}

std::int64_t Problem::visible_pairs() const { return over_sequences(*this, visible_pairs_of); }

std::int64_t Problem::fully_masked_rows() const { return over_sequences(*this, fully_masked_rows_of); }

std::int64_t Problem::seq_len(std::int64_t b) const {
  return seq_lens.empty() ? seq : seq_lens[static_cast<std::size_t>(b)];
}

std::int64_t Problem::kv_seq_len(std::int64_t b) const {
  if (seq_lens.empty()) return kv_seq;
  const std::vector<std::int64_t>& kv = kv_seq_lens.empty() ? seq_lens : kv_seq_lens;
  return kv[static_cast<std::size_t>(b)];
}

std::int64_t Problem::total_q() const {
  if (lengths_on_device) return packed_total_q;
  return varlen() ? sum_of(seq_lens) : batch * seq;
}

std::int64_t Problem::total_kv() const {
  if (lengths_on_device) return packed_total_kv;
  if (!varlen()) return batch * kv_seq;
  return sum_of(kv_seq_lens.empty() ? seq_lens : kv_seq_lens);
}

namespace {
// What host code may not ask of a batch whose lengths only the kernels read.
void lengths_not_on_host(const Problem& p, const char* what) {
  if (p.lengths_on_device) {
    fail(ErrorKind::Internal, std::string(what) + " of a packed batch whose lengths are on the device (" +
                                  p.describe() + "): read them first (Traits::device_lengths)");
  }
}
}  // namespace

std::vector<std::int64_t> Problem::cu_seqlens_q() const {
  lengths_not_on_host(*this, "cu_seqlens_q");
  std::vector<std::int64_t> cu{0};
  for (std::int64_t b = 0; b < batch; ++b) cu.push_back(cu.back() + seq_len(b));
  return cu;
}

std::vector<std::int64_t> Problem::cu_seqlens_k() const {
  lengths_not_on_host(*this, "cu_seqlens_k");
  std::vector<std::int64_t> cu{0};
  for (std::int64_t b = 0; b < batch; ++b) cu.push_back(cu.back() + kv_seq_len(b));
  return cu;
}

Problem Problem::sequence(std::int64_t b) const {
  lengths_not_on_host(*this, "a sequence");
  Problem s = *this;
  s.seq_lens.clear();
  s.kv_seq_lens.clear();
  s.batch = 1;
  s.seq = seq_len(b);
  s.kv_seq = kv_seq_len(b);
  return s;
}

Problem Problem::padded() const {
  Problem s = *this;
  s.seq_lens.clear();
  s.kv_seq_lens.clear();
  s.lengths_on_device = false;
  s.packed_total_q = s.packed_total_kv = 0;
  return s;
}

Dims Problem::q_dims() const {
  return varlen() ? Dims{1, heads, total_q(), head_dim} : Dims{batch, heads, seq, head_dim};
}

Dims Problem::kv_dims() const {
  const std::int64_t hk = kv_heads == 0 ? heads : kv_heads;
  return varlen() ? Dims{1, hk, total_kv(), head_dim} : Dims{batch, hk, kv_seq == 0 ? seq : kv_seq, head_dim};
}

double Problem::forward_flops() const {
  // A packed batch's visible pairs already sum its sequences.
  const double sequences = varlen() ? 1.0 : static_cast<double>(batch);
  return 4.0 * sequences * static_cast<double>(heads) * static_cast<double>(visible_pairs()) *
         static_cast<double>(head_dim);
}

double Problem::flops() const {
  switch (pass) {
    case Pass::Backward:
      return 2.5 * forward_flops();
    case Pass::Train:
      return 3.5 * forward_flops();
    default:
      return forward_flops();
  }
}

std::size_t Problem::gradient_bytes() const {
  return pass == Pass::Forward ? 0 : sum({q_bytes(), q_bytes(), kv_bytes(), kv_bytes()});
}

std::size_t Problem::lse_bytes() const { return bytes_of({heads, total_q()}, sizeof(float)); }

std::int64_t Problem::kv_rows_read() const { return over_sequences(*this, kv_rows_read_of); }

std::size_t Problem::io_bytes() const {
  // Q, K and V in the input dtype (one byte for fp8); O, dO and a bias in
  // the output's (bf16 for fp8).
  const std::size_t es = element_size(dtype);
  const std::size_t mask_bytes = mask == MaskKind::Boolean ? bytes_of({seq, kv_seq}, element_size(DType::Bool))
                                 : mask == MaskKind::Bias  ? bytes_of({seq, kv_seq}, element_size(output_dtype(dtype)))
                                                           : 0;
  // A paged cache's block table is read too; its pages' padding is not.
  const std::size_t table = kv_cache == KvCache::Paged ? bytes_of({batch, pages_per_seq()}, 4) : 0;
  const std::size_t q = q_bytes(), kv = kv_bytes(), o = o_bytes();
  const std::size_t kv_read = bytes_of({varlen() ? 1 : batch, kv_heads, kv_rows_read(), head_dim}, es);
  const std::size_t forward = sum({q, kv_read, kv_read, mask_bytes, table,  // Q, K, V (mask, table) in
                                   o});                                     // O out
  const std::size_t backward =
      sum({q, o, o, kv_read, kv_read, lse_bytes(), mask_bytes,  // Q, O, dO, K, V, LSE (mask) in
           q, kv, kv});                                         // dQ, dK, dV out
  switch (pass) {
    case Pass::Backward:
      return backward;
    case Pass::Train:
      return sum({forward, lse_bytes(), backward});
    default:
      return forward;
  }
}

namespace {
constexpr std::pair<Pass, std::string_view> kPasses[] = {
    {Pass::Forward, "forward"}, {Pass::Backward, "backward"}, {Pass::Train, "train"}};
}  // namespace

std::string_view pass_name(Pass p) {
  for (const auto& [k, n] : kPasses) {
    if (k == p) return n;
  }
  return "?";
}

std::optional<Pass> parse_pass(std::string_view name) {
  for (const auto& [k, n] : kPasses) {
    if (n == name) return k;
  }
  return std::nullopt;
}

std::size_t Problem::q_bytes() const { return bytes_of({heads, total_q(), head_dim}, element_size(dtype)); }

std::size_t Problem::o_bytes() const {
  return bytes_of({heads, total_q(), head_dim}, element_size(output_dtype(dtype)));
}

std::size_t Problem::kv_bytes() const { return bytes_of({kv_heads, total_kv(), head_dim}, element_size(dtype)); }

std::size_t Problem::kv_page_bytes() const {
  if (kv_cache != KvCache::Paged) return 0;
  const std::int64_t pages = batch * pages_per_seq();
  return sum({bytes_of({pages, kv_heads, page_size, head_dim}, element_size(dtype)), bytes_of({pages}, 2)});
}

Problem varlen_problem(Problem base, std::vector<std::int64_t> seq_lens, std::vector<std::int64_t> kv_seq_lens) {
  if (kv_seq_lens.empty()) kv_seq_lens = seq_lens;
  base.batch = static_cast<std::int64_t>(seq_lens.size());
  base.seq = max_of(seq_lens);
  base.kv_seq = max_of(kv_seq_lens);
  base.seq_lens = std::move(seq_lens);
  base.kv_seq_lens = std::move(kv_seq_lens);
  return base;
}

void Backend::forward_train(const Problem& p, const Inputs&, Tensor&, Saved&, RunContext&) {
  fail(ErrorKind::Unsupported, no_backward(name()).reason + " (" + p.describe() + ")");
}

void Backend::backward(const Problem& p, const Inputs&, const Tensor&, const Tensor&, const Saved&, Gradients&,
                       RunContext&) {
  fail(ErrorKind::Unsupported, no_backward(name()).reason + " (" + p.describe() + ")");
}

const std::vector<std::string_view>& backend_names() {
  static const std::vector<std::string_view> names = {"naive", "naive_inplace", "math", "efficient", "flash", "cudnn"};
  return names;
}

bool is_backend_name(std::string_view name) {
  const auto& n = backend_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

}  // namespace attnprof
