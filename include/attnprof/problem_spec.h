// One problem spec for every front end: the defaults a run takes when a field
// is not given, every field of a Problem parsed from text, and numbers read
// strictly. The CLI's flags and Python's keywords both come through here, so
// they take the same spellings and are refused with the same messages. Those
// messages name the field as the Problem spells it ("head_dim must be
// positive") and list it in Error::fields(), for a front end to show in its
// own terms (the CLI: "--head-dim").
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

// Numbers from text, read strictly: decimal digits after an optional '-' (a
// real may have a fraction and an exponent); no hex, no '+', no space before
// or after. An integer must lie in [lo, hi]; a real must be finite. Throws
// Error(InvalidArgument) naming `field`.
std::int64_t parse_integer(std::string_view field, std::string_view text,
                           std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                           std::int64_t hi = std::numeric_limits<std::int64_t>::max());
double parse_real(std::string_view field, std::string_view text);

// Sets one field of `p` from text: set_problem_field(p, "head_dim", "64").
// Sizes (batch, heads, kv_heads, seq, kv_seq, window, page_size) must be
// positive; 0 is not a value a user gives (it stands for "the default").
// Names take every spelling parse_dtype, parse_device, parse_mask,
// parse_pass and parse_kv_cache do; deterministic takes true or false;
// softcap a positive real (0, "no cap", is given by leaving it out);
// seq_lens and kv_seq_lens a comma-separated list of lengths ("512,1024,7",
// each 0 or more), which also sets seq (kv_seq) to their maximum.
// Throws Error(InvalidArgument) naming the field, and for a name the
// accepted ones. Problem::validate() still checks the whole problem.
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
