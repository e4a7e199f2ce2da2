#include "attnprof/problem_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <system_error>
#include <utility>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"

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

std::int64_t positive(std::string_view field, std::string_view text) {
  const std::int64_t v = parse_integer(field, text);
  if (v <= 0) refuse(field, std::string(field) + " must be positive, got " + std::to_string(v));
  return v;
}

// A name field: parsed by `parse`, refused with the accepted spellings.
template <class T, class Parse>
T named(std::string_view field, std::string_view text, Parse parse, std::string_view choices) {
  if (const std::optional<T> v = parse(text)) return *v;
  refuse(field, "unknown " + std::string(field) + " " + quoted(text) + ": use " + std::string(choices));
}

// "512,1024,7": a packed batch's lengths, each a whole number from 0.
std::vector<std::int64_t> lengths(std::string_view field, std::string_view text) {
  std::vector<std::int64_t> out;
  for (std::size_t start = 0;;) {
    const std::size_t comma = text.find(',', start);
    const std::string_view piece = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    out.push_back(parse_integer(field, piece, 0, std::int64_t{1} << 22));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::int64_t longest(const std::vector<std::int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

using Setter = std::function<void(Problem&, std::string_view field, std::string_view text)>;

Setter size(std::int64_t Problem::*member) {
  return [member](Problem& p, std::string_view f, std::string_view t) { p.*member = positive(f, t); };
}

// In Problem's order; problem_fields() lists the names.
const std::vector<std::pair<std::string_view, Setter>>& setters() {
  static const std::vector<std::pair<std::string_view, Setter>> table = {
      {"batch", size(&Problem::batch)},
      {"heads", size(&Problem::heads)},
      {"kv_heads", size(&Problem::kv_heads)},
      {"seq", size(&Problem::seq)},
      {"kv_seq", size(&Problem::kv_seq)},
      // 0 and negatives reach validate(), which names the supported range.
      {"head_dim", [](Problem& p, auto f, auto t) { p.head_dim = parse_integer(f, t); }},
      {"dtype",
       [](Problem& p, auto f, auto t) {
         p.dtype = named<DType>(f, t, parse_dtype,
                                "fp32, fp16, bf16 or fp8 (or float32, float16, bfloat16, e4m3, float8_e4m3fn)");
       }},
      {"device",
       [](Problem& p, auto f, auto t) {
         p.device = named<Device>(f, t, parse_device, "cpu or cuda (cuda is also spelled cuda:0 or gpu)");
       }},
      {"mask", [](Problem& p, auto f, auto t) { p.mask = named<MaskKind>(f, t, parse_mask, mask_choices()); }},
      {"window", size(&Problem::window)},
      {"scale", [](Problem& p, auto f, auto t) { p.scale = parse_real(f, t); }},
      // 0 is the Problem's "no cap", not a value to give: leaving it out is.
      {"softcap",
       [](Problem& p, auto f, auto t) {
         const double c = parse_real(f, t);
         if (!(c > 0)) {
           refuse(f, std::string(f) +
                         " must be positive (scores become tanh(s / c) * c; leave it out for no cap), got " +
                         quoted(t));
         }
         p.softcap = c;
       }},
      {"pass",
       [](Problem& p, auto f, auto t) { p.pass = named<Pass>(f, t, parse_pass, "forward, backward or train"); }},
      {"deterministic",
       [](Problem& p, auto f, auto t) {
         if (t != "true" && t != "false") refuse(f, std::string(f) + " takes true or false, got " + quoted(t));
         p.deterministic = t == "true";
       }},
      {"kv_cache",
       [](Problem& p, auto f, auto t) { p.kv_cache = named<KvCache>(f, t, parse_kv_cache, kv_cache_choices()); }},
      {"page_size", size(&Problem::page_size)},
      // A packed batch: seq (and kv_seq) become the longest length, as
      // max_seqlen_q (_k); a seq given after them is the maximum itself.
      {"seq_lens",
       [](Problem& p, auto f, auto t) {
         p.seq_lens = lengths(f, t);
         p.seq = longest(p.seq_lens);
       }},
      {"kv_seq_lens",
       [](Problem& p, auto f, auto t) {
         p.kv_seq_lens = lengths(f, t);
         p.kv_seq = longest(p.kv_seq_lens);
       }},
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
