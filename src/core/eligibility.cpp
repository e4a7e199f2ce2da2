// Whether a backend takes a problem in a batch layout, and why not: the one
// place that answers "this layout on this backend" (eligibility_of,
// attnprof/backend.h). It reads the backend's traits for what every backend
// declares the same way (a backward, a soft cap, packed batches, lengths on
// the device, fp8, a paged cache, per-sequence rows), then asks the backend's
// own eligibility for the rest.
#include <string>

#include "attnprof/backend.h"
#include "attnprof/batch_layout.h"
#include "attnprof/problem.h"

namespace attnprof {

// These say only why the backend cannot take the problem: explain() (the
// registry) appends the backends that can, asked the same way, so no list of
// names is kept here to drift from the backends' traits.
Eligibility no_backward(std::string_view backend) {
  return {false, std::string(backend) + " has no backward pass: use pass=forward, or a backend with one"};
}

Eligibility no_softcap(std::string_view backend, Device device) {
  return {false,
          "soft-capping is not built for " + std::string(backend) + " on " + std::string(device_name(device)) + " yet"};
}

Eligibility no_varlen(std::string_view backend, Device device) {
  return {false, "packed batches (seq_lens, varlen) are not built for " + std::string(backend) + " on " +
                     std::string(device_name(device)) + " yet"};
}

Eligibility no_fp8(std::string_view backend, Device device) {
  return {false,
          "fp8 (e4m3) inputs are not built for " + std::string(backend) + " on " + std::string(device_name(device))};
}

namespace {

std::string on_device(const Backend& b) {
  return std::string(b.name()) + " on " + std::string(device_name(b.device()));
}

// The answer for a layout that agrees with the problem.
Eligibility answer(const Backend& b, const Problem& p, const BatchLayout& l) {
  if (p.pass != Pass::Forward && !b.has_backward()) return no_backward(b.name());
  const Traits t = b.traits();
  if (p.softcap > 0 && !t.softcap) return no_softcap(b.name(), b.device());
  if (l.form == BatchLayout::Form::Packed && !t.varlen) return no_varlen(b.name(), b.device());
  if (p.lengths_on_device && !t.device_lengths) {
    return {false, on_device(b) + " reads a packed batch's lengths on the host (the call reads cu_seqlens first)"};
  }
  if (is_fp8(p.dtype) && !t.fp8) return no_fp8(b.name(), b.device());
  if (p.deterministic && !t.backward_dq_unordered) {
    return {false, std::string(b.name()) +
                       "'s backward sums dQ in a fixed order already: deterministic=true applies only to a "
                       "backward that sums dQ in the order its blocks finish"};
  }
  if (l.form == BatchLayout::Form::Paged && !t.paged) {
    return {false, on_device(b) + " reads no paged KV cache: use kv_cache=contiguous, or a backend that pages"};
  }
  if (l.form == BatchLayout::Form::Padded && !t.rows) {
    return {false, on_device(b) + " reads no per-sequence rows, which layout " + layout_text(l) + " gives every run"};
  }
  if (l.form == BatchLayout::Form::Paged && l.kv_rows && !t.paged_lengths) {
    return {false, on_device(b) + " takes one kv length for every sequence, and layout " + layout_text(l) +
                       " gives each its own (or pad the shorter sequences' pages)"};
  }
  return b.eligibility(p);
}

}  // namespace

Eligibility eligibility_of(const Backend& b, const Problem& p, const BatchLayout& l) {
  check_layout(p, l);
  return answer(b, p, l);
}

// The problem's own layout needs no check (and an unvalidated problem, say
// packed and paged at once, is still answered rather than refused here:
// validate() says what is wrong with it).
Eligibility eligibility_of(const Backend& b, const Problem& p) { return answer(b, p, p.layout()); }

}  // namespace attnprof
