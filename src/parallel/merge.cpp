// The CPU merge (merge.h), in float64: the check of the rule the kernel uses.
#include "parallel/merge.h"

#include "attnprof/error.h"

namespace attnprof::parallel {

void merge_into(std::span<double> o_a, std::span<double> lse_a, std::span<const double> o_b,
                std::span<const double> lse_b, std::int64_t dim) {
  const auto rows = lse_a.size();
  if (lse_b.size() != rows || o_a.size() != rows * static_cast<std::size_t>(dim) || o_b.size() != o_a.size()) {
    fail(ErrorKind::Internal, "merge_into: partial results of different shapes");
  }
  for (std::size_t r = 0; r < rows; ++r) {
    const MergeWeights<double> w = merge_weights(lse_a[r], lse_b[r]);
    for (std::int64_t d = 0; d < dim; ++d) {
      const std::size_t at = r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(d);
      o_a[at] = w.wa * o_a[at] + w.wb * o_b[at];
    }
    lse_a[r] = w.lse;
  }
}

}  // namespace attnprof::parallel
