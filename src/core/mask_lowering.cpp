#include "core/mask_lowering.h"

#include <limits>

namespace attnprof {

std::optional<std::vector<std::int32_t>> key_padding_lengths(const Tensor& mask) {
  if (!mask.defined() || mask.dtype() != DType::Bool || mask.device() != Device::Cpu) return std::nullopt;
  const std::int64_t B = mask.size(0), H = mask.size(1), S = mask.size(2), Skv = mask.size(3);
  if (Skv > std::numeric_limits<std::int32_t>::max()) return std::nullopt;
  const auto* bits = mask.data_as<const std::uint8_t>();
  const std::int64_t inc = mask.stride(3);
  // A broadcast dimension (stride 0) holds one distinct row: visit it once.
  const std::int64_t hs = mask.stride(1) == 0 ? 1 : H;
  const std::int64_t is = mask.stride(2) == 0 ? 1 : S;
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::uint8_t* first = bits + mask.index(b, 0, 0, 0);
    std::int64_t len = 0;
    while (len < Skv && first[len * inc]) ++len;
    for (std::int64_t j = len; j < Skv; ++j) {
      if (first[j * inc]) return std::nullopt;  // a True after a False: not a prefix
    }
    for (std::int64_t h = 0; h < hs; ++h) {
      for (std::int64_t i = 0; i < is; ++i) {
        if (h == 0 && i == 0) continue;
        const std::uint8_t* row = bits + mask.index(b, h, i, 0);
        for (std::int64_t j = 0; j < Skv; ++j) {
          if ((row[j * inc] != 0) != (j < len)) return std::nullopt;
        }
      }
    }
    lengths[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(len);
  }
  return lengths;
}

}  // namespace attnprof
