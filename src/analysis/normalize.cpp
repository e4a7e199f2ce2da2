#include "analysis/normalize.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>

namespace attnprof::analysis {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// PyTorch ops that are one of ours under another name. A matrix product is a
// matmul whichever kernel entry point ran it; a dtype conversion is a "to".
constexpr std::array<std::pair<std::string_view, std::string_view>, 7> kOpAliases{{
    {"mm", "matmul"},
    {"bmm", "matmul"},
    {"addmm", "matmul"},
    {"baddbmm", "matmul"},
    {"_to_copy", "to"},
    {"_softmax", "softmax"},
    {"_masked_softmax", "softmax"},
}};

// Lower-cased spellings (c10 type names, Python names, ours) to ours.
constexpr std::array<std::pair<std::string_view, std::string_view>, 26> kDtypeAliases{{
    {"float8_e4m3fn", "fp8"}, {"fp8", "fp8"},  // e4m3fn: torch's Float8_e4m3fn, ours
    {"bfloat16", "bf16"},     {"bf16", "bf16"},      {"half", "fp16"},     {"float16", "fp16"},
    {"fp16", "fp16"},         {"float", "fp32"},     {"float32", "fp32"},  {"fp32", "fp32"},
    {"double", "fp64"},       {"float64", "fp64"},   {"fp64", "fp64"},     {"bool", "bool"},
    {"long", "int64"},        {"long int", "int64"}, {"int64_t", "int64"}, {"int64", "int64"},
    {"int", "int32"},         {"int32_t", "int32"},  {"int32", "int32"},   {"unsigned char", "uint8"},
    {"uint8_t", "uint8"},     {"byte", "uint8"},     {"scalar", "scalar"}, {"tensorlist", "tensorlist"},
}};

}  // namespace

std::string normalize_op(std::string_view name) {
  name = trim(name);
  if (name.starts_with("aten::")) name.remove_prefix(6);
  for (const auto& [from, to] : kOpAliases) {
    if (name == from) return std::string(to);
  }
  return std::string(name);
}

std::string normalize_dtype(std::string_view name) {
  name = trim(name);
  if (name.starts_with("c10::")) name.remove_prefix(5);
  if (name.starts_with("torch.")) name.remove_prefix(6);
  const std::string l = lower(name);
  for (const auto& [from, to] : kDtypeAliases) {
    if (l == from) return std::string(to);
  }
  return l;
}

std::string normalize_dtypes(std::string_view list) {
  std::string out;
  bool first = true;
  while (true) {
    const std::size_t comma = list.find(',');
    if (!first) out += ", ";
    out += normalize_dtype(list.substr(0, comma));
    first = false;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

std::string_view first_dtype(std::string_view normalized_list) {
  return normalized_list.substr(0, normalized_list.find(','));
}

NormalizedNames normalize(const Activity& a) {
  if (a.type != ActivityType::CpuOp) return {a.name, {}};
  return {normalize_op(a.name), a.input_dtypes.empty() ? std::string() : normalize_dtypes(a.input_dtypes)};
}

GemmClass gemm_class(std::string_view name) {
  const auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  const bool gemm = has("gemm") || has("nvjet") || has("cutlass") || has("xmma") || has("s16816") || has("h16816");
  if (!gemm) return GemmClass::NotGemm;
  if (has("tf32")) return GemmClass::Tf32TensorCores;
  if (has("sgemm") || has("gemmSN") || has("f32f32_f32f32")) return GemmClass::Fp32CudaCores;
  if (has("hmma") || has("wgmma") || has("gmma") || has("s16816") || has("h16816") || has("s1688") || has("h1688") ||
      has("nvjet") || has("bf16") || has("f16") || has("tensorop") || has("TensorOp")) {
    return GemmClass::TensorCores;
  }
  return GemmClass::NotGemm;
}

std::string_view gemm_class_name(GemmClass g) {
  // The enum's order: NotGemm, Fp32CudaCores, Tf32TensorCores, TensorCores.
  constexpr std::array<std::string_view, 4> kNames{"", "CUDA cores", "TF32 tensor cores", "tensor cores"};
  return kNames[static_cast<std::size_t>(g)];
}

}  // namespace attnprof::analysis
