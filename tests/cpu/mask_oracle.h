// The structural masks as DESIGN.md and problem.h state them, written out
// independently of Problem::visible so that tests do not share the code they check.
#pragma once

#include <cstdint>

#include "attnprof/problem.h"

namespace attnprof::testing {

inline bool expected_visible(const Problem& p, std::int64_t i, std::int64_t j) {
  const std::int64_t off = p.kv_seq - p.seq;
  switch (p.mask) {
    case MaskKind::Causal:
      return j <= i;
    case MaskKind::CausalBottomRight:
      return j <= i + off;
    case MaskKind::SlidingWindow:
      // j > i + off - window, arranged so that no window up to INT64_MAX overflows.
      return j <= i + off && j - i - off > -p.window;
    default:
      return true;
  }
}

}  // namespace attnprof::testing
