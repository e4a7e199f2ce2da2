// How a batch's sequences lie in a call's tensors (BatchLayout), and the one
// band of keys each query row sees (Band): the layout question asked once, by
// the problem's validation, every backend's eligibility (eligibility_of with a
// layout, attnprof/backend.h) and the plans (attnprof/plan.h), rather than
// worked out again by each.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "attnprof/mask.h"

namespace attnprof {

struct Problem;
struct Inputs;

// The keys query row i of a sequence sees, relative to a diagonal: keys
// i + d - left .. i + d + right, where d is the diagonal's key offset (0 top
// left, seq_k - seq_q bottom right) and -1 on a side is "no bound". Causal is
// (-1, 0) on either diagonal, a sliding window of w keys (w - 1, 0) on the
// bottom-right one, no mask (-1, -1). A mask tensor (Boolean, Bias) has no
// band: band_of gives nullopt.
struct Band {
  enum class Diagonal : std::uint8_t { TopLeft, BottomRight };
  std::int64_t left = -1;
  std::int64_t right = -1;
  Diagonal diagonal = Diagonal::TopLeft;
  auto operator<=>(const Band&) const = default;
};
// The band of a structural mask (window read under SlidingWindow only), or
// nullopt for a mask tensor.
std::optional<Band> band_of(MaskKind mask, std::int64_t window);
// "(-1, 0) top-left": messages and plans' explain().
std::string band_text(const Band& band);

// How a batch's sequences lie in the tensors. The sizes are the Problem's;
// the layout says which of Inputs' index tensors every run gives.
//   Dense   q [B, H, S, D], k and v [B, Hkv, Skv, D]; no index tensor.
//   Padded  the same tensors, each sequence its own rows of them:
//           Inputs::q_rows and/or kv_rows (int32 [1, 1, B, 2]).
//   Packed  the problem's seq_lens (Problem::varlen()): q [1, H, total_q, D],
//           k and v [1, Hkv, total_kv, D]; the lengths are the problem's, or
//           each run's cu_seqlens (Problem::lengths_on_device).
//   Paged   Problem::kv_cache Paged: Inputs::k_pages, v_pages, block_table
//           ([1, 1, B, pages_per_seq]); with kv_rows, each run's
//           Inputs::kv_rows holds each sequence's key count ([1, 1, B, 1], a
//           serving engine's seq_lens; a plan's runs always give it); the
//           problem's kv_seq is the table's capacity (pages_per_seq x
//           page_size).
struct BatchLayout {
  enum class Form : std::uint8_t { Dense, Padded, Packed, Paged };
  Form form = Form::Dense;
  bool q_rows = false;   // Padded: runs give Inputs::q_rows
  bool kv_rows = false;  // Padded: runs give Inputs::kv_rows; Paged: each sequence's key count
  // The band every sequence applies at its own diagonal; unset: the
  // problem's mask says it (check_layout refuses a band the mask contradicts).
  std::optional<Band> band;
  auto operator<=>(const BatchLayout&) const = default;  // ordered: a key of the bindings' backend cache

  // Whether runs give per-sequence rows (a padded batch's, a paged cache's
  // key counts): backends read them only where their Traits::rows (padded)
  // or Traits::paged_lengths (paged) says so.
  bool reads_rows() const { return q_rows || kv_rows; }
};
std::string_view layout_name(BatchLayout::Form form);  // "dense", "padded", "packed", "paged"
// "padded (q_rows, kv_rows)", "paged (seq_lens)", "packed": messages.
std::string layout_text(const BatchLayout& layout);

// The layout of a call of `p` with `in`: packed or paged as the problem says
// (paged with kv_rows where `in` has them), padded where `in` has rows, else
// dense; the band the problem's mask gives. Problem::layout() is the same
// with no index tensors.
BatchLayout layout_of(const Problem& p, const Inputs& in);

// Throws Error(InvalidArgument) (field "layout") when `l` contradicts `p`:
// packed without seq_lens or the reverse, paged without kv_cache paged or
// the reverse, padded with no rows, rows on a layout that has none, rows with
// a mask tensor, a band other than the problem's mask's.
void check_layout(const Problem& p, const BatchLayout& l);

}  // namespace attnprof
