// What one attention op's record says (attention_op_args.h): the table of the
// schemas whose arguments are read, the backend an op's name commits to, the
// call's shapes, dtype, mask, scale and FLOPs from "Input Dims", "Input type"
// and "Concrete Inputs", and attnprof's label where torch kept no strings.
#include "analysis/attention_op_args.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

#include "analysis/normalize.h"

namespace attnprof::analysis::op_args {
namespace {

constexpr std::array kSignatures = {
    Signature{.name = "aten::scaled_dot_product_attention", .mask = 3, .causal = 5, .scale = 6},
    Signature{.name = "aten::_scaled_dot_product_flash_attention", .causal = 4, .scale = 6},
    Signature{.name = "aten::_scaled_dot_product_flash_attention_for_cpu", .mask = 5, .causal = 4, .scale = 6},
    Signature{.name = "aten::_scaled_dot_product_efficient_attention", .mask = 3, .causal = 6, .scale = 7},
    Signature{.name = "aten::_scaled_dot_product_cudnn_attention", .mask = 3, .causal = 6, .scale = 8},
    Signature{.name = "aten::_scaled_dot_product_attention_math", .mask = 3, .causal = 5, .scale = 7},
    Signature{.name = "aten::_scaled_dot_product_flash_attention_backward",
              .q = 1,
              .k = 2,
              .v = 3,
              .causal = 11,
              .scale = 14,
              .backward = true},
    Signature{.name = "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
              .q = 1,
              .k = 2,
              .v = 3,
              .mask = 8,
              .causal = 7,
              .scale = 9,
              .backward = true},
    Signature{.name = "aten::_scaled_dot_product_efficient_attention_backward",
              .q = 1,
              .k = 2,
              .v = 3,
              .mask = 4,
              .causal = 11,
              .scale = 12,
              .backward = true},
    Signature{.name = "aten::_scaled_dot_product_cudnn_attention_backward",
              .q = 1,
              .k = 2,
              .v = 3,
              .mask = 8,
              .causal = 14,
              .scale = 15,
              .backward = true},
    Signature{.name = "flash_attn::_flash_attn_forward",
              .causal = 5,
              .scale = 4,
              .window_left = 6,
              .window_right = 7,
              .bshd = true,
              .bottom_right = true},
    Signature{.name = "flash_attn::_flash_attn_backward",
              .q = 1,
              .k = 2,
              .v = 3,
              .causal = 11,
              .scale = 10,
              .window_left = 12,
              .window_right = 13,
              .bshd = true,
              .bottom_right = true,
              .backward = true},
    Signature{.name = "attnprof::attention", .scale = 6, .mask_name = 4, .window = 5, .bshd_flag = 7},
    Signature{.name = "attnprof::attention_train", .scale = 6, .mask_name = 4, .window = 5, .bshd_flag = 7},
    Signature{.name = "attnprof::attention_backward",
              .q = 1,
              .k = 2,
              .v = 3,
              .scale = 9,
              .mask_name = 7,
              .window = 8,
              .bshd_flag = 10,
              .backward = true},
};

// "[2, 4, 256, 64], [], [[1, 2]]" -> one vector of integers per top-level
// entry (nested lists flattened; an empty list is an absent tensor).
std::vector<std::vector<std::int64_t>> parse_dims(std::string_view text) {
  std::vector<std::vector<std::int64_t>> out;
  int depth = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '[') {
      if (depth++ == 0) out.emplace_back();
    } else if (c == ']') {
      --depth;
    } else if (depth == 0 && c == ',') {
      continue;
    } else if ((c >= '0' && c <= '9') || c == '-') {
      std::int64_t x = 0;
      const auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), x);
      if (ec == std::errc() && !out.empty() && depth > 0) out.back().push_back(x);
      i = static_cast<std::size_t>(p - text.data()) - 1;
    }
  }
  return out;
}

// "Input type" entries, split as the reader joined them (", ").
std::vector<std::string_view> split_types(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(", ", pos), text.size());
    out.push_back(text.substr(pos, comma - pos));
    pos = comma + 2;
  }
  return out;
}

std::string dims_str(const std::vector<std::int64_t>& d) {
  std::string s;
  for (auto x : d) {
    if (!s.empty()) s += 'x';  // appended: GCC 12 warns (-Wrestrict, a false positive) on "x" + string
    s += std::to_string(x);
  }
  return s;
}

// Shapes whose FLOPs count is exact and quick: positive, query rows a
// walk can visit, scores inside 64 bits (validate()'s own bounds, less its
// head_dim and dtype limits, which say what runs, not what counts).
bool countable(const Problem& p) {
  constexpr std::int64_t kRows = std::int64_t{1} << 24, kHeads = std::int64_t{1} << 24, kDim = 1 << 16;
  for (const std::int64_t x : {p.batch, p.heads, p.kv_heads, p.seq, p.kv_seq, p.head_dim}) {
    if (x <= 0) return false;
  }
  return p.seq <= kRows && p.kv_seq <= kRows && p.batch <= kHeads && p.heads <= kHeads && p.batch * p.heads <= kHeads &&
         p.head_dim <= kDim;
}

// A whole number read from a trace's string, where a window or count goes:
// none for NaN, infinities and magnitudes no int64 of this kind should hold.
std::optional<std::int64_t> whole(std::optional<double> x) {
  if (!x || !std::isfinite(*x) || std::abs(*x) > 1e15) return std::nullopt;
  return static_cast<std::int64_t>(*x);
}

}  // namespace

bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

const Signature* signature_of(std::string_view name) {
  for (const auto& s : kSignatures) {
    if (s.name == name) return &s;
  }
  // flex_attention's higher-order op: q, k, v first, its mask a block mask.
  static constexpr Signature kFlex{.name = "flex_attention"};
  static constexpr Signature kFlexBackward{.name = "flex_attention_backward", .q = 0, .k = 1, .v = 2, .backward = true};
  if (has(name, "flex_attention")) return has(name, "backward") ? &kFlexBackward : &kFlex;
  return nullptr;
}

std::string backend_of_op(std::string_view n) {
  if (n.starts_with("attnprof::")) return "attnprof";
  if (n.starts_with("flash_attn::") || has(n, "FlashAttnFunc") || has(n, "FlashAttnVarlenFunc")) return "flash_attn";
  if (has(n, "flex_attention") || has(n, "FlexAttention")) return "flex";
  if (has(n, "scaled_dot_product_flash_attention") || has(n, "FlashAttentionBackward") || has(n, "_flash_attention_")) {
    return "flash";
  }
  if (has(n, "scaled_dot_product_efficient_attention") || has(n, "EfficientAttentionBackward") ||
      has(n, "_efficient_attention_")) {
    return "efficient";
  }
  if (has(n, "scaled_dot_product_cudnn_attention") || has(n, "CudnnAttentionBackward") || has(n, "_cudnn_attention_")) {
    return "cudnn";
  }
  if (has(n, "_scaled_dot_product_attention_math")) return "math";
  if (has(n, "fused_attention_overrideable")) return "overrideable";
  return {};
}

bool is_backward_op(std::string_view n) { return has(n, "backward") || has(n, "Backward"); }

std::optional<double> number(std::string_view s) {
  if (s.empty()) return std::nullopt;
  double x = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec != std::errc()) return std::nullopt;
  return x;
}

std::string_view at(const std::vector<std::string>& v, int i) {
  return i >= 0 && static_cast<std::size_t>(i) < v.size() ? std::string_view(v[static_cast<std::size_t>(i)])
                                                          : std::string_view();
}

bool read_shapes(const Activity& a, const Signature& sig, AttentionCall& call) {
  const auto dims = parse_dims(a.input_dims);
  const auto dim = [&](int i) -> const std::vector<std::int64_t>* {
    return i >= 0 && static_cast<std::size_t>(i) < dims.size() ? &dims[static_cast<std::size_t>(i)] : nullptr;
  };
  const auto* q = dim(sig.q);
  const auto* k = dim(sig.k);
  if (!q || !k || q->size() != 4 || k->size() != 4) return false;
  const auto types = split_types(a.input_dtypes);
  const auto type_at = [&](int i) {
    return i >= 0 && static_cast<std::size_t>(i) < types.size() ? types[static_cast<std::size_t>(i)]
                                                                : std::string_view();
  };
  const auto& c = a.concrete_inputs;
  const bool bshd = sig.bshd || at(c, sig.bshd_flag) == "True" || at(c, sig.bshd_flag) == "true";
  Problem p;
  p.pass = sig.backward ? Pass::Backward : Pass::Forward;
  p.device = Device::Cuda;
  p.batch = (*q)[0];
  p.heads = bshd ? (*q)[2] : (*q)[1];
  p.seq = bshd ? (*q)[1] : (*q)[2];
  p.head_dim = (*q)[3];
  p.kv_heads = bshd ? (*k)[2] : (*k)[1];
  p.kv_seq = bshd ? (*k)[1] : (*k)[2];
  call.dtype = normalize_dtype(type_at(sig.q));
  if (const auto dt = parse_dtype(call.dtype)) p.dtype = *dt;

  p.mask = MaskKind::None;
  if (const auto* m = dim(sig.mask); m && !m->empty()) {
    p.mask = normalize_dtype(type_at(sig.mask)) == "bool" ? MaskKind::Boolean : MaskKind::Bias;
  } else if (at(c, sig.causal) == "True" || at(c, sig.causal) == "true") {
    p.mask = sig.bottom_right ? MaskKind::CausalBottomRight : MaskKind::Causal;
  }
  // flash_attn's window (left, right): keys i + off - left .. i + off + right; -1 unbounded.
  if (const auto left = whole(number(at(c, sig.window_left))); left && *left >= 0) {
    const auto right = whole(number(at(c, sig.window_right)));
    if (p.mask == MaskKind::CausalBottomRight || (right && *right == 0)) {
      p.mask = MaskKind::SlidingWindow;
      p.window = *left + 1;
    }
  }
  bool mask_known = true;
  if (sig.mask_name >= 0) {
    // attnprof's ops: the mask by name, when the trace kept the string.
    const auto m = parse_mask(at(c, sig.mask_name));
    mask_known = m.has_value();
    if (m) p.mask = *m;
    if (const auto w = whole(number(at(c, sig.window)))) p.window = *w;
  }
  if (sig.name.starts_with("flex_attention")) call.mask = "block_mask";
  if (!mask_known) call.mask = "unknown";
  call.scale = number(at(c, sig.scale));
  p.scale = call.scale;
  p.normalize();
  if (call.mask.empty()) call.mask = std::string(mask_name(p.mask));
  call.shape = dims_str({p.batch, p.heads, p.seq, p.head_dim});
  if (p.kv_heads != p.heads || p.kv_seq != p.seq) {
    call.shape += ", kv " + dims_str({p.batch, p.kv_heads, p.kv_seq, p.head_dim});
  }
  // A block mask's visible pairs are not in the trace: no exact count. Nor
  // for shapes past what the count can hold: visible_pairs() walks every
  // query row (seq = 10^12 from a corrupt trace would take hours) and
  // seq x kv_seq must stay inside 64 bits.
  if (call.mask != "block_mask" && call.mask != "unknown" && countable(p)) call.flops = p.flops();
  call.problem = p;
  return true;
}

std::optional<AttnprofLabel> attnprof_label(const TraceIndex& ix, EventIndex op) {
  constexpr std::string_view kPrefix = "attnprof.attention ";
  // Inside the op (its implementation opens it, compiled graphs too), or, in
  // older traces, around it (the Python front end did).
  EventIndex e = ix.annotation_inside(op);
  if (e == kNone || !ix.at(e).name.starts_with(kPrefix)) e = ix.parent(op);
  for (; e != kNone; e = ix.parent(e)) {
    const Activity& u = ix.at(e);
    if (u.type != ActivityType::UserAnnotation || !u.name.starts_with(kPrefix)) continue;
    AttnprofLabel l;
    std::string_view rest = std::string_view(u.name).substr(kPrefix.size());
    while (!rest.empty()) {
      const std::size_t end = std::min(rest.find(' '), rest.size());
      const std::string_view field = rest.substr(0, end);
      rest.remove_prefix(std::min(end + 1, rest.size()));
      const std::size_t eq = field.find('=');
      if (eq == std::string_view::npos) continue;
      const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
      if (key == "backend") l.backend = std::string(value);
      if (key == "mask") l.mask = std::string(value);
      if (key == "window") l.window = whole(number(value));
    }
    return l;
  }
  return std::nullopt;
}

void apply_label_mask(const AttnprofLabel& l, AttentionCall& call) {
  const auto m = parse_mask(l.mask);
  if (call.mask != "unknown" || !m || !call.problem) return;
  Problem p = *call.problem;
  p.mask = *m;
  if (l.window) p.window = *l.window;
  if (p.mask == MaskKind::SlidingWindow && p.window <= 0) return;
  call.mask = std::string(mask_name(p.mask));
  const bool structural = p.mask != MaskKind::Boolean && p.mask != MaskKind::Bias;
  if (structural && countable(p)) call.flops = p.flops();
  call.problem = p;
}

}  // namespace attnprof::analysis::op_args
