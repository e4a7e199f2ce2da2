#include "core/rows.h"

#include <string>

#include "attnprof/error.h"

namespace attnprof {
namespace {

std::string pair_text(std::int64_t a, std::int64_t b) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

// One of q_rows or kv_rows into spans[b].q or .k, checked against `limit` rows.
// Key ends alone are named as the caller gave them: `ends_name` (seq_lens for a
// paged cache), with `ends_bound` after the limit (what makes it).
void read_rows(const char* name, const Tensor& t, std::int64_t batch, std::int64_t limit,
               std::vector<SequenceRows>& rows, bool queries, const char* ends_name = "kv_rows",
               const std::string& ends_bound = "") {
  if (!t.defined()) {
    for (SequenceRows& r : rows) (queries ? r.q : r.k) = {0, limit};
    return;
  }
  // kv_rows may also hold key ends alone ([1, 1, B, 1], begin 0: a paged
  // call's seq_lens as the CUDA path passes them).
  const bool ends_only = !queries && t.sizes() == Dims{1, 1, batch, 1};
  if (t.dtype() != DType::I32 || (t.sizes() != Dims{1, 1, batch, 2} && !ends_only)) {
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " must be int32 [B, 2] = [" + std::to_string(batch) +
             ", 2] (each sequence's (begin, end) rows" + (queries ? "" : "; or [B, 1], its key ends from 0") +
             "), got " + t.describe(),
         {name});
  }
  if (t.device() != Device::Cpu) {
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " is read on the host here and is on " + std::string(device_name(t.device())) +
             ": pass it on the CPU",
         {name});
  }
  const auto* at = t.data_as<const std::int32_t>();
  const int width = ends_only ? 1 : 2;
  for (std::int64_t b = 0; b < batch; ++b) {
    // The entry as the kernels read it (geometry::span_rows); here anything
    // they would clamp is refused instead.
    const std::int64_t entry_at[2] = {at[b * t.stride(2)], ends_only ? 0 : at[b * t.stride(2) + t.stride(3)]};
    const geometry::ClampedRows<std::int64_t> read = geometry::span_rows(entry_at, width, limit);
    if (!read.exact) {
      const std::int64_t begin = ends_only ? 0 : entry_at[0], end = entry_at[width - 1];
      const std::string at_b = "[" + std::to_string(b) + "] = ";
      if (ends_only) {  // a key count, as the caller gave it (a paged call's seq_lens)
        fail(ErrorKind::InvalidArgument,
             std::string(ends_name) + at_b + std::to_string(end) + " is outside 0 .. " + std::to_string(limit) +
                 ends_bound,
             {ends_name});
      }
      const std::string entry = std::string(name) + at_b + pair_text(begin, end);
      if (begin > end && begin >= 0 && end <= limit) {
        fail(ErrorKind::InvalidArgument, entry + " begins after it ends (begin <= end)", {name});
      }
      fail(ErrorKind::InvalidArgument, entry + " is outside 0 .. " + std::to_string(limit), {name});
    }
    (queries ? rows[static_cast<std::size_t>(b)].q : rows[static_cast<std::size_t>(b)].k) = read.rows;
  }
}

}  // namespace

std::vector<SequenceRows> sequence_rows(const Problem& p, const Inputs& in) {
  if (!has_rows(in)) return {};
  const char* given = in.q_rows.defined() ? "q_rows" : "kv_rows";
  if (p.varlen()) {
    fail(ErrorKind::InvalidArgument,
         std::string(given) + " with a packed batch (cu_seqlens): its sequences already have their own rows", {given});
  }
  if (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias) {
    fail(ErrorKind::InvalidArgument,
         std::string(given) +
             " with a tensor mask: rows take a structural mask (none, causal, causal-bottom-right, sliding-window)",
         {given});
  }
  std::vector<SequenceRows> rows(static_cast<std::size_t>(p.batch));
  read_rows("q_rows", in.q_rows, p.batch, p.seq, rows, true);
  if (p.kv_cache == KvCache::Paged && p.page_size > 0) {
    read_rows("kv_rows", in.kv_rows, p.batch, p.kv_seq, rows, false, "seq_lens",
              " (the block table's " + std::to_string(p.pages_per_seq()) + " pages of " + std::to_string(p.page_size) +
                  " keys)");
  } else {
    read_rows("kv_rows", in.kv_rows, p.batch, p.kv_seq, rows, false);
  }
  return rows;
}

std::vector<SequenceView> sequence_views(const Problem& p, const std::vector<SequenceRows>& rows) {
  if (p.lengths_on_device) {
    fail(ErrorKind::Internal, "sequence_views: a packed batch's lengths are on the device; the host reads none");
  }
  std::vector<SequenceView> views(static_cast<std::size_t>(p.batch));
  std::int64_t q0 = 0, k0 = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    SequenceView& v = views[static_cast<std::size_t>(b)];
    if (p.varlen()) {
      v.rows = {.q = {q0, q0 + p.seq_len(b)}, .k = {k0, k0 + p.kv_seq_len(b)}};
      q0 = v.rows.q.end;
      k0 = v.rows.k.end;
    } else {
      v.tb = b;
      v.rows = rows.empty() ? SequenceRows{.q = {0, p.seq}, .k = {0, p.kv_seq}} : rows[static_cast<std::size_t>(b)];
    }
  }
  return views;
}

Tensor rows_mask(const Problem& p, const std::vector<SequenceRows>& rows, Allocator& allocator) {
  Tensor m = Tensor::empty({p.batch, 1, p.seq, p.kv_seq}, DType::Bool, allocator);
  auto* bits = m.data_as<std::uint8_t>();
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const SequenceRows& r = rows[static_cast<std::size_t>(b)];
    const auto band = r.band(p.mask, p.window);
    for (std::int64_t i = 0; i < p.seq; ++i) {
      for (std::int64_t j = 0; j < p.kv_seq; ++j) bits[(b * p.seq + i) * p.kv_seq + j] = r.sees(band, i, j);
    }
  }
  return m;
}

LoweredRows lower_rows(const Problem& p, const Inputs& in, Allocator& allocator) {
  LoweredRows l{.p = p, .in = in};
  const std::vector<SequenceRows> rows = sequence_rows(p, in);
  if (rows.empty()) return l;
  l.in.mask = rows_mask(p, rows, allocator).expand({p.batch, p.heads, p.seq, p.kv_seq});
  l.in.q_rows = Tensor();
  l.in.kv_rows = Tensor();
  l.p.mask = MaskKind::Boolean;
  l.p.window = 0;
  return l;
}

void zero_outside_rows(const Tensor& t, const std::vector<SequenceRows>& rows, bool queries) {
  for (std::size_t b = 0; b < rows.size(); ++b) {
    const geometry::Span<std::int64_t> keep = queries ? rows[b].q : rows[b].k;
    for (std::int64_t h = 0; h < t.size(1); ++h) {
      for (std::int64_t i = 0; i < t.size(2); ++i) {
        if (i >= keep.begin && i < keep.end) continue;
        for (std::int64_t d = 0; d < t.size(3); ++d) t.set(static_cast<std::int64_t>(b), h, i, d, 0.0f);
      }
    }
  }
}

}  // namespace attnprof
