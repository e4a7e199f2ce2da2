#include "attnprof/problem_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <system_error>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "core/problem_detail.h"

namespace attnprof {
namespace {

[[noreturn]] void refuse(std::string_view field, const std::string& message) {
  fail(ErrorKind::InvalidArgument, message, {std::string(field)});
}

// Built by appending: g++ 12 warns (-Wrestrict) on "'" + std::string here.
std::string quoted(std::string_view text) {
  std::string s = "'";
  s += text;
  s += '\'';
  return s;
}

// A name field: parsed by `parse`, refused with the accepted spellings.
template <class T, class Parse>
T named(std::string_view field, std::string_view text, Parse parse, std::string_view choices) {
  if (const std::optional<T> v = parse(text)) return *v;
  refuse(field, "unknown " + std::string(field) + " " + quoted(text) + ": use " + std::string(choices));
}

// A size given: 0 would read as "not given" (the default), so it is refused
// here, where the value is known to have been given, as negatives are.
std::optional<std::int64_t> size(std::string_view field, std::optional<std::int64_t> v) {
  if (v && *v <= 0) refuse(field, std::string(field) + " must be positive, got " + std::to_string(*v));
  return v;
}

template <class T>
void set(T& field, const std::optional<T>& v) {
  if (v) field = *v;
}

// A packed batch's lengths given: at least one. Each length's range is validate()'s.
void set_lengths(std::vector<std::int64_t>& lens, std::int64_t& longest, std::string_view field,
                 const std::optional<std::vector<std::int64_t>>& given) {
  if (!given) return;
  if (given->empty()) refuse(field, std::string(field) + " is empty: give one length per sequence");
  lens = *given;
  longest = *std::max_element(lens.begin(), lens.end());
}

// "512,1024,7": a packed batch's lengths, each a whole number (its range is validate()'s).
std::vector<std::int64_t> lengths(std::string_view field, std::string_view text) {
  std::vector<std::int64_t> out;
  for (std::size_t start = 0;;) {
    const std::size_t comma = text.find(',', start);
    const std::string_view piece = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    out.push_back(parse_integer(field, piece));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

bool boolean(std::string_view field, std::string_view text) {
  if (text != "true" && text != "false")
    refuse(field, std::string(field) + " takes true or false, got " + quoted(text));
  return text == "true";
}

// Each field read from text into its type, then applied as a typed value is.
using Setter = std::function<void(Problem&, std::string_view field, std::string_view text)>;

// In Problem's order; problem_fields() lists the names.
const std::vector<std::pair<std::string_view, Setter>>& setters() {
  using P = Problem&;
  using F = std::string_view;
  static const std::vector<std::pair<std::string_view, Setter>> table = {
      {"batch", [](P p, F f, F t) { apply_problem_args(p, {.batch = parse_integer(f, t)}); }},
      {"heads", [](P p, F f, F t) { apply_problem_args(p, {.heads = parse_integer(f, t)}); }},
      {"kv_heads", [](P p, F f, F t) { apply_problem_args(p, {.kv_heads = parse_integer(f, t)}); }},
      {"seq", [](P p, F f, F t) { apply_problem_args(p, {.seq = parse_integer(f, t)}); }},
      {"kv_seq", [](P p, F f, F t) { apply_problem_args(p, {.kv_seq = parse_integer(f, t)}); }},
      {"head_dim", [](P p, F f, F t) { apply_problem_args(p, {.head_dim = parse_integer(f, t)}); }},
      {"dtype", [](P p, F, F t) { apply_problem_args(p, {.dtype = dtype_from_text(t)}); }},
      {"device", [](P p, F, F t) { apply_problem_args(p, {.device = device_from_text(t)}); }},
      {"mask", [](P p, F, F t) { apply_problem_args(p, {.mask = mask_from_text(t)}); }},
      {"window", [](P p, F f, F t) { apply_problem_args(p, {.window = parse_integer(f, t)}); }},
      {"scale", [](P p, F f, F t) { apply_problem_args(p, {.scale = parse_real(f, t)}); }},
      {"softcap", [](P p, F f, F t) { apply_problem_args(p, {.softcap = parse_real(f, t)}); }},
      {"pass", [](P p, F, F t) { apply_problem_args(p, {.pass = pass_from_text(t)}); }},
      {"deterministic", [](P p, F f, F t) { apply_problem_args(p, {.deterministic = boolean(f, t)}); }},
      {"kv_cache", [](P p, F, F t) { apply_problem_args(p, {.kv_cache = kv_cache_from_text(t)}); }},
      {"page_size", [](P p, F f, F t) { apply_problem_args(p, {.page_size = parse_integer(f, t)}); }},
      {"seq_lens", [](P p, F f, F t) { apply_problem_args(p, {.seq_lens = lengths(f, t)}); }},
      {"kv_seq_lens", [](P p, F f, F t) { apply_problem_args(p, {.kv_seq_lens = lengths(f, t)}); }},
  };
  return table;
}

}  // namespace

std::optional<Layout> parse_layout(std::string_view name) {
  if (name == "bhsd") return Layout::Bhsd;
  if (name == "bshd") return Layout::Bshd;
  return std::nullopt;
}

Layout layout_from_text(std::string_view text) {
  return named<Layout>("layout", text, parse_layout, "bhsd ([B, H, S, D]) or bshd ([B, S, H, D])");
}

DType dtype_from_text(std::string_view text) {
  return named<DType>("dtype", text, parse_dtype,
                      "fp32, fp16, bf16 or fp8 (or float32, float16, bfloat16, e4m3, float8_e4m3fn)");
}

Device device_from_text(std::string_view text) {
  return named<Device>("device", text, parse_device, "cpu or cuda (cuda is also spelled cuda:0 or gpu)");
}

MaskKind mask_from_text(std::string_view text) { return named<MaskKind>("mask", text, parse_mask, mask_choices()); }

Pass pass_from_text(std::string_view text) {
  return named<Pass>("pass", text, parse_pass, "forward, backward or train");
}

KvCache kv_cache_from_text(std::string_view text) {
  return named<KvCache>("kv_cache", text, parse_kv_cache, kv_cache_choices());
}

void apply_problem_args(Problem& p, const ProblemArgs& a) {
  set(p.batch, size("batch", a.batch));
  set(p.heads, size("heads", a.heads));
  set(p.kv_heads, size("kv_heads", a.kv_heads));
  set(p.seq, size("seq", a.seq));
  set(p.kv_seq, size("kv_seq", a.kv_seq));
  set(p.head_dim, a.head_dim);  // 0 and negatives reach validate(), which names the supported range
  set(p.dtype, a.dtype);
  set(p.device, a.device);
  set(p.mask, a.mask);
  set(p.window, size("window", a.window));
  if (a.scale) p.scale = *a.scale;
  // 0 is the Problem's "no cap", not a value to give: leaving it out is.
  // A NaN goes on to validate(), which names the cap's range.
  if (a.softcap && *a.softcap <= 0) {
    refuse("softcap", "softcap must be positive (scores become tanh(s / c) * c; leave it out for no cap), got " +
                          problem_detail::format_real(*a.softcap));
  }
  set(p.softcap, a.softcap);
  set(p.pass, a.pass);
  set(p.deterministic, a.deterministic);
  set(p.kv_cache, a.kv_cache);
  set(p.page_size, size("page_size", a.page_size));
  set_lengths(p.seq_lens, p.seq, "seq_lens", a.seq_lens);
  set_lengths(p.kv_seq_lens, p.kv_seq, "kv_seq_lens", a.kv_seq_lens);
}

Problem problem_from_args(const ProblemArgs& a) {
  Problem p;
  p.batch = 0;  // the device's, unless given
  p.heads = 0;
  apply_problem_args(p, a);
  fill_device_defaults(p).normalize().validate();
  return p;
}

std::optional<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda" || name == "cuda:0" || name == "gpu") return Device::Cuda;
  return std::nullopt;
}

std::int64_t default_batch(Device d) { return d == Device::Cuda ? 8 : 2; }
std::int64_t default_heads(Device d) { return d == Device::Cuda ? 16 : 8; }

Problem& fill_device_defaults(Problem& p) {
  // A packed batch's batch is its count of sequences.
  if (p.batch == 0 && p.varlen()) p.batch = static_cast<std::int64_t>(p.seq_lens.size());
  if (p.batch == 0) p.batch = default_batch(p.device);
  if (p.heads == 0) p.heads = default_heads(p.device);
  return p;
}

std::int64_t parse_integer(std::string_view field, std::string_view text, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) {
    refuse(field, std::string(field) + " " + std::string(text) + " is out of range");
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    refuse(field, std::string(field) + " expects a whole number, got " + quoted(text));
  }
  if (v < lo || v > hi) {
    refuse(field, std::string(field) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                      ", got " + std::to_string(v));
  }
  return v;
}

double parse_real(std::string_view field, std::string_view text) {
  // from_chars, unlike strtod, takes no hex, no leading space and no '+'.
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) {
    refuse(field, std::string(field) + " " + std::string(text) + " is out of range");
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    refuse(field, std::string(field) + " expects a decimal number such as 0.125, got " + quoted(text));
  }
  if (!std::isfinite(v)) refuse(field, std::string(field) + " must be a finite number, got " + quoted(text));
  return v;
}

void set_problem_field(Problem& p, std::string_view field, std::string_view text) {
  for (const auto& [name, set] : setters()) {
    if (name == field) return set(p, field, text);
  }
  fail(ErrorKind::Internal, "set_problem_field: no field " + std::string(field));
}

const std::vector<std::string_view>& problem_fields() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const auto& s : setters()) v.push_back(s.first);
    return v;
  }();
  return names;
}

std::optional<double> fp8_descale_from_text(std::string_view text) {
  constexpr std::string_view field = "fp8_descale";
  if (text == "auto") return std::nullopt;
  double v = 0;
  try {
    v = parse_real(field, text);
  } catch (const Error&) {
    refuse(field,
           std::string(field) + " takes auto or a finite positive number (real = e4m3 x descale), got " + quoted(text));
  }
  check_fp8_descale(field, v);
  return v;
}

std::string backend_choices(bool with_auto) {
  std::string s;
  for (auto n : backend_names()) s += (s.empty() ? "" : ", ") + std::string(n);
  return with_auto ? s + ", auto" : s;
}

void check_backend_name(std::string_view field, std::string_view name, bool auto_ok) {
  if (is_backend_name(name) || (auto_ok && name == "auto")) return;
  const std::string in = field == "backend" ? "" : " in " + std::string(field);
  if (name == "auto") {  // and not taken here
    refuse(field, "auto is not a backend to list" + in + " (it picks one): use " + backend_choices(false));
  }
  refuse(field, "unknown backend " + quoted(name) + in + ": use " + backend_choices(auto_ok));
}

}  // namespace attnprof
