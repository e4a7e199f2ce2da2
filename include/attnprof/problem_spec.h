// One problem spec for every front end: the defaults a run takes when a field
// is not given, a problem from typed values (ProblemArgs: Python's keywords,
// or code), and every field of a Problem parsed from text (the CLI's flags),
// which reads the text into the same typed values and applies them the same
// way. So each value is checked once, in one place: apply_problem_args() for
// what a given value may not be (0, which stands for "not given"), and
// Problem::validate() for the rest. The messages name the field as the
// Problem spells it ("head_dim must be positive") and list it in
// Error::fields(), for a front end to show in its own terms (the CLI:
// "--head-dim").
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/problem.h"

namespace attnprof {

// How Q, K and V lie in memory: [B, H, S, D], or [B, S, H, D] read through
// strided views of the same tensors.
enum class Layout : std::uint8_t { Bhsd, Bshd };
std::optional<Layout> parse_layout(std::string_view name);
// parse_layout, or Error(InvalidArgument) naming the field "layout".
Layout layout_from_text(std::string_view text);
// The names of a problem's fields: every spelling parse_dtype, parse_device,
// parse_mask, parse_pass and parse_kv_cache take, or Error(InvalidArgument)
// naming the field and listing the accepted ones.
DType dtype_from_text(std::string_view text);
Device device_from_text(std::string_view text);
MaskKind mask_from_text(std::string_view text);
Pass pass_from_text(std::string_view text);
KvCache kv_cache_from_text(std::string_view text);

// cpu; cuda, cuda:0 or gpu (the CUDA runtime is device 0's).
std::optional<Device> parse_device(std::string_view name);

// The shape of a run whose batch or heads are left 0: on a GPU the reference
// shape's (8, 16); on the CPU a smaller batch and head count, so every backend
// finishes well inside a minute on a few cores.
std::int64_t default_batch(Device d);
std::int64_t default_heads(Device d);
// Fills batch and heads left 0 with the device's defaults (a packed batch's
// batch: its count of sequences). Only front ends
// call it, where 0 means "not given"; a Problem read off arrays never does.
Problem& fill_device_defaults(Problem& p);

// A problem's fields as typed values, as a front end that holds numbers and
// lists gives them (Python's keywords): each one set is applied, an unset one
// keeps what the problem holds. Nothing here goes through text.
// Each member initialized, so that designated initializers may name only some.
struct ProblemArgs {
  std::optional<std::int64_t> batch{}, heads{}, kv_heads{}, seq{}, kv_seq{}, head_dim{};
  std::optional<DType> dtype{};
  std::optional<Device> device{};
  std::optional<MaskKind> mask{};
  std::optional<std::int64_t> window{};
  std::optional<double> scale{}, softcap{};
  std::optional<Pass> pass{};
  std::optional<bool> deterministic{};
  std::optional<KvCache> kv_cache{};
  std::optional<std::int64_t> page_size{};
  // A packed batch's lengths: seq_lens also sets seq to the longest (as
  // max_seqlen_q), kv_seq_lens kv_seq, after a seq or kv_seq given beside them.
  std::optional<std::vector<std::int64_t>> seq_lens{}, kv_seq_lens{};
};

// Applies the fields `a` sets to `p`, in Problem's order. Refuses only what
// validate() cannot tell from "not given": a size (batch, heads, kv_heads,
// seq, kv_seq, window, page_size) or a soft cap of 0 or less (0 stands for
// the default, or no cap, which is said by leaving the field unset), and an
// empty list of lengths. Every other check of a value is Problem::validate()'s.
// Throws Error(InvalidArgument) naming the field.
void apply_problem_args(Problem& p, const ProblemArgs& a);
// A problem from typed values: the default problem with batch and heads
// left to the device's defaults, `a` applied, then fill_device_defaults,
// normalize and validate.
Problem problem_from_args(const ProblemArgs& a);

// Numbers from text, read strictly: decimal digits after an optional '-' (a
// real may have a fraction and an exponent); no hex, no '+', no space before
// or after. An integer must lie in [lo, hi]; a real must be finite. Throws
// Error(InvalidArgument) naming `field`.
std::int64_t parse_integer(std::string_view field, std::string_view text,
                           std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                           std::int64_t hi = std::numeric_limits<std::int64_t>::max());
double parse_real(std::string_view field, std::string_view text);

// Sets one field of `p` from text (the CLI's): set_problem_field(p,
// "head_dim", "64"). The text is read into the field's type (integers and
// reals strictly, names as the *_from_text functions take them, deterministic
// true or false, seq_lens and kv_seq_lens a comma-separated list such as
// "512,1024,7") and applied by apply_problem_args(), which says what a given
// value may not be. Throws Error(InvalidArgument) naming the field.
// Problem::validate() checks the whole problem.
void set_problem_field(Problem& p, std::string_view field, std::string_view text);
// The fields set_problem_field takes, in Problem's order.
const std::vector<std::string_view>& problem_fields();

// An FP8 run's descale (RunOptions::fp8_descale) from text: "auto" (unset:
// each tensor's amax / 448), or one finite positive real for q, k and v.
// Throws Error(InvalidArgument) naming fp8_descale.
std::optional<double> fp8_descale_from_text(std::string_view text);

// A backend asked for by name in `field` (backend, backends, expect): one of
// backend_names(), or "auto" where `auto_ok`. Throws Error(InvalidArgument)
// listing exactly the names that check takes.
void check_backend_name(std::string_view field, std::string_view name, bool auto_ok);
// "naive, naive_inplace, math, efficient, flash, cudnn" (then ", auto").
std::string backend_choices(bool with_auto);

}  // namespace attnprof
