#include "attnprof/dtype.h"

namespace attnprof {

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32" || name == "float") return DType::F32;
  if (name == "fp16" || name == "float16" || name == "half") return DType::F16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp8" || name == "e4m3" || name == "float8_e4m3fn") return DType::F8E4M3;
  return std::nullopt;
}

}  // namespace attnprof
