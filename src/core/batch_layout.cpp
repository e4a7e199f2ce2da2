// BatchLayout and Band (attnprof/batch_layout.h): a call's layout read off the
// problem and its inputs, and checked against the problem in one place.
#include "attnprof/batch_layout.h"

#include <string>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"

namespace attnprof {

std::optional<Band> band_of(MaskKind mask, std::int64_t window) {
  switch (mask) {
    case MaskKind::None:
      return Band{};
    case MaskKind::Causal:
      return Band{.left = -1, .right = 0, .diagonal = Band::Diagonal::TopLeft};
    case MaskKind::CausalBottomRight:
      return Band{.left = -1, .right = 0, .diagonal = Band::Diagonal::BottomRight};
    case MaskKind::SlidingWindow:
      return Band{.left = window - 1, .right = 0, .diagonal = Band::Diagonal::BottomRight};
    case MaskKind::Boolean:
    case MaskKind::Bias:
      return std::nullopt;
  }
  return std::nullopt;
}

std::string band_text(const Band& band) {
  return "(" + std::to_string(band.left) + ", " + std::to_string(band.right) + ") " +
         (band.diagonal == Band::Diagonal::TopLeft ? "top-left" : "bottom-right");
}

std::string_view layout_name(BatchLayout::Form form) {
  switch (form) {
    case BatchLayout::Form::Dense:
      return "dense";
    case BatchLayout::Form::Padded:
      return "padded";
    case BatchLayout::Form::Packed:
      return "packed";
    case BatchLayout::Form::Paged:
      return "paged";
  }
  return "?";
}

std::string layout_text(const BatchLayout& l) {
  std::string out(layout_name(l.form));
  if (l.form == BatchLayout::Form::Paged) return l.kv_rows ? out + " (seq_lens)" : out;
  if (!l.reads_rows()) return out;
  return out + " (" + (l.q_rows ? "q_rows" : "") + (l.q_rows && l.kv_rows ? ", " : "") + (l.kv_rows ? "kv_rows" : "") +
         ")";
}

BatchLayout Problem::layout() const {
  BatchLayout l;
  if (varlen()) {
    l.form = BatchLayout::Form::Packed;
  } else if (kv_cache == KvCache::Paged) {
    l.form = BatchLayout::Form::Paged;
  }
  l.band = band_of(mask, window);
  return l;
}

BatchLayout layout_of(const Problem& p, const Inputs& in) {
  BatchLayout l = p.layout();
  if (l.form == BatchLayout::Form::Paged) {
    l.kv_rows = in.kv_rows.defined();
  } else if (l.form == BatchLayout::Form::Dense && (in.q_rows.defined() || in.kv_rows.defined())) {
    l.form = BatchLayout::Form::Padded;
    l.q_rows = in.q_rows.defined();
    l.kv_rows = in.kv_rows.defined();
  }
  return l;
}

void check_layout(const Problem& p, const BatchLayout& l) {
  using Form = BatchLayout::Form;
  const std::string form(layout_name(l.form));
  const auto refuse = [](const std::string& why) { fail(ErrorKind::InvalidArgument, why, {"layout"}); };
  if ((l.form == Form::Packed) != p.varlen()) {
    refuse(p.varlen() ? "layout " + form + " for a packed problem (seq_lens): use the packed layout"
                      : "layout packed for a problem without seq_lens: give the packed batch's lengths");
  }
  if ((l.form == Form::Paged) != (p.kv_cache == KvCache::Paged)) {
    refuse(p.kv_cache == KvCache::Paged
               ? "layout " + form + " for a paged problem (kv_cache paged): use the paged layout"
               : "layout paged for a problem with a contiguous cache: set kv_cache paged");
  }
  if (l.form == Form::Padded && !l.q_rows && !l.kv_rows) {
    refuse("layout padded names neither q_rows nor kv_rows: one of them, or layout dense");
  }
  if (l.form != Form::Padded && (l.q_rows || (l.kv_rows && l.form != Form::Paged))) {
    refuse(std::string(l.q_rows ? "q_rows belongs" : "kv_rows belongs") + " to the padded layout" +
           (l.q_rows ? "" : " (or a paged cache's seq_lens)") + ", not " + form);
  }
  if (l.reads_rows() && (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias)) {
    refuse("layout " + form + " takes a structural mask (the rows say each sequence's keys), not a " +
           std::string(mask_name(p.mask)) + " tensor");
  }
  if (l.band) {
    const std::optional<Band> mine = band_of(p.mask, p.window);
    if (!mine) {
      refuse("layout band " + band_text(*l.band) + " with a " + std::string(mask_name(p.mask)) +
             " mask tensor: a band is a structural mask's");
    }
    if (*mine != *l.band) {
      refuse("layout band " + band_text(*l.band) + " but the problem's mask (" + std::string(mask_name(p.mask)) +
             ") is " + band_text(*mine));
    }
  }
}

}  // namespace attnprof
