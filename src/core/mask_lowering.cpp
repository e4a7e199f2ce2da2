#include "core/mask_lowering.h"

#include <limits>

namespace attnprof {

std::optional<std::vector<RowSpan>> key_padding_rows(const Tensor& mask) {
  if (!mask.defined() || mask.dtype() != DType::Bool || mask.device() != Device::Cpu) return std::nullopt;
  const std::int64_t B = mask.size(0), H = mask.size(1), S = mask.size(2), Skv = mask.size(3);
  if (Skv > std::numeric_limits<std::int32_t>::max()) return std::nullopt;
  const auto* bits = mask.data_as<const std::uint8_t>();
  const std::int64_t inc = mask.stride(3);
  // A broadcast dimension (stride 0) holds one distinct row: visit it once.
  const std::int64_t hs = mask.stride(1) == 0 ? 1 : H;
  const std::int64_t is = mask.stride(2) == 0 ? 1 : S;
  std::vector<RowSpan> rows(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::uint8_t* first = bits + mask.index(b, 0, 0, 0);
    std::int64_t begin = 0;
    while (begin < Skv && !first[begin * inc]) ++begin;
    std::int64_t end = begin;
    while (end < Skv && first[end * inc]) ++end;
    for (std::int64_t j = end; j < Skv; ++j) {
      if (first[j * inc]) return std::nullopt;  // a second run of Trues: not one run
    }
    if (begin == end) begin = end = 0;  // no key: the empty run at 0
    for (std::int64_t h = 0; h < hs; ++h) {
      for (std::int64_t i = 0; i < is; ++i) {
        if (h == 0 && i == 0) continue;
        const std::uint8_t* row = bits + mask.index(b, h, i, 0);
        for (std::int64_t j = 0; j < Skv; ++j) {
          if ((row[j * inc] != 0) != (j >= begin && j < end)) return std::nullopt;
        }
      }
    }
    rows[static_cast<std::size_t>(b)] = {static_cast<std::int32_t>(begin), static_cast<std::int32_t>(end)};
  }
  return rows;
}

}  // namespace attnprof
