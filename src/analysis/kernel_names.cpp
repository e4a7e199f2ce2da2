#include "analysis/kernel_names.h"

#include <vector>

namespace attnprof::analysis {
namespace {

// `s` without a leading "void " and without its argument list: the first '('
// outside template brackets, where the name is followed by one.
std::string_view signature_head(std::string_view s) {
  if (s.starts_with("void ")) s.remove_prefix(5);
  int depth = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') {
      ++depth;
    } else if (c == '>') {
      --depth;
    } else if (c == '(' && depth == 0 && i > 0 && s[i - 1] != ' ') {
      return s.substr(0, i);
    }
  }
  return s;
}

// The last component of a qualified name, outside brackets: "at::native::f" -> "f".
std::string_view unqualified(std::string_view s) {
  int depth = 0;
  std::size_t from = 0;
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    const char c = s[i];
    if (c == '<' || c == '(' || c == '[' || c == '{') ++depth;
    if (c == '>' || c == ')' || c == ']' || c == '}') --depth;
    if (depth == 0 && c == ':' && s[i + 1] == ':') from = i + 2;
  }
  return s.substr(from);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// One template argument as a reader names it: a number stays, a lambda is
// "lambda", anything else its unqualified name without its own arguments.
std::string argument(std::string_view a) {
  a = trim(a);
  if (a.find("lambda") != std::string_view::npos || a.starts_with("{") || a.starts_with("[")) return "lambda";
  std::string_view base = a.substr(0, a.find_first_of("<("));
  base = trim(unqualified(trim(base)));
  if (base.starts_with("(anonymous namespace)::")) base.remove_prefix(23);
  return std::string(base.empty() ? a.substr(0, 20) : base);
}

}  // namespace

std::string attention_backend_of_kernel(std::string_view k, bool strict) {
  const auto has = [&k](std::string_view part) { return k.find(part) != std::string_view::npos; };
  if (has("attnprof::cuda::kernels::")) {
    if (has("::flash_")) return "attnprof:flash";
    if (has("::efficient_")) return "attnprof:efficient";
    return {};
  }
  if (has("flash_fwd") || has("flash_bwd") || has("pytorch_flash")) return "flash";
  if (has("fmha_cutlass") || has("MemEffAttention") || (has("cutlass::Kernel") && has("Attention"))) {
    return "efficient";
  }
  if (has("cudnn") && (has("sdpa") || has("fmha") || has("flash"))) return "cudnn";
  if (has("flex_attention")) return "flex";
  if (!strict && has("triton_tem_fused")) return "flex";
  return {};
}

std::string kernel_base_name(std::string_view name) {
  const std::string_view head = signature_head(name);
  std::string_view base = unqualified(head.substr(0, head.find('<')));
  base = trim(base);
  return std::string(base.empty() ? name.substr(0, 70) : base);
}

std::string short_kernel_name(std::string_view name, std::size_t max) {
  const std::string_view head = signature_head(name);
  const std::size_t open = head.find('<');
  std::string out = kernel_base_name(name);
  if (open == 0) return std::string(name.substr(0, max));  // no name before the brackets: no C++ signature
  if (open != std::string_view::npos && head.find('>', open) != std::string_view::npos) {
    // The first level of template arguments, split at commas outside brackets.
    std::vector<std::string> args;
    int depth = 0;
    std::size_t from = open + 1;
    for (std::size_t i = open; i < head.size(); ++i) {
      const char c = head[i];
      if (c == '<' || c == '(' || c == '[' || c == '{') ++depth;
      if (c == '>' || c == ')' || c == ']' || c == '}') {
        if (--depth == 0) {
          args.push_back(argument(head.substr(from, i - from)));
          break;
        }
      }
      if (c == ',' && depth == 1) {
        args.push_back(argument(head.substr(from, i - from)));
        from = i + 1;
      }
    }
    std::string joined;
    for (const auto& a : args) {
      if (!joined.empty()) joined += ", ";
      joined += a;
    }
    out += joined.empty() || out.size() + joined.size() + 2 > max ? "<...>" : "<" + joined + ">";
  }
  if (out.size() > max) out = out.substr(0, max - 3) + "...";
  return out;
}

}  // namespace attnprof::analysis
