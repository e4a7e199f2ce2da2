// Whether two strided tensors share memory, and the forward's check that its
// output shares none with its inputs (issue 49: flash with out=V gave wrong
// numbers, the kernels reading V's blocks after writing O over them).
#include "attnprof/aliasing.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/tensor.h"

namespace attnprof {
namespace {

// A half-open range of addresses [lo, hi).
struct Span {
  std::uintptr_t lo = 0, hi = 0;
  bool operator<(const Span& o) const { return lo < o.lo; }
};

// Every address t's elements occupy lies in this span.
Span span_of(const Tensor& t) {
  const auto base = reinterpret_cast<std::intptr_t>(t.data());
  const auto bytes = static_cast<std::intptr_t>(element_size(t.dtype()));
  std::intptr_t lo = 0, hi = 0;
  for (int d = 0; d < 4; ++d) {
    const std::intptr_t extent = static_cast<std::intptr_t>((t.size(d) - 1) * t.stride(d));
    lo += std::min<std::intptr_t>(0, extent);
    hi += std::max<std::intptr_t>(0, extent);
  }
  return {static_cast<std::uintptr_t>(base + lo * bytes), static_cast<std::uintptr_t>(base + (hi + 1) * bytes)};
}

// More runs than this and the exact check is not worth its time: spans that
// meet are then taken as overlapping.
constexpr std::int64_t kMaxRuns = std::int64_t{1} << 22;

// t's memory as runs of contiguous bytes (one per row where the last dim is
// unit-stride, else one per element), sorted; empty past kMaxRuns.
std::vector<Span> runs_of(const Tensor& t) {
  const bool rows = t.rows_contiguous();
  const std::int64_t per_run = rows ? t.size(3) : 1;
  const std::int64_t count = t.numel() / per_run;
  std::vector<Span> runs;
  if (count > kMaxRuns) return runs;
  runs.reserve(static_cast<std::size_t>(count));
  const auto base = reinterpret_cast<std::uintptr_t>(t.data());
  const auto bytes = static_cast<std::int64_t>(element_size(t.dtype()));
  const std::int64_t inner = rows ? 1 : t.size(3);
  for (std::int64_t a = 0; a < t.size(0); ++a)
    for (std::int64_t b = 0; b < t.size(1); ++b)
      for (std::int64_t c = 0; c < t.size(2); ++c)
        for (std::int64_t d = 0; d < inner; ++d) {
          const auto lo = static_cast<std::uintptr_t>(static_cast<std::intptr_t>(base) + t.index(a, b, c, d) * bytes);
          runs.push_back({lo, lo + static_cast<std::uintptr_t>(per_run * bytes)});
        }
  std::sort(runs.begin(), runs.end());
  return runs;
}

// Whether any run of a meets any run of b (both sorted by start; runs of one
// list may overlap each other, as a broadcast view's do).
bool runs_meet(const std::vector<Span>& a, const std::vector<Span>& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].hi <= b[j].lo) {
      ++i;
    } else if (b[j].hi <= a[i].lo) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

}  // namespace

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) return false;
  const Span sa = span_of(a), sb = span_of(b);
  if (sa.hi <= sb.lo || sb.hi <= sa.lo) return false;
  // The spans meet: views of one buffer, either sharing elements or
  // interleaved (q, k and v as slices of one packed qkv tensor).
  const std::vector<Span> ra = runs_of(a), rb = runs_of(b);
  if (ra.empty() || rb.empty()) return true;
  return runs_meet(ra, rb);
}

void require_output_apart(const Inputs& in, const Tensor& out, std::string_view backend) {
  const std::pair<const char*, const Tensor*> inputs[] = {
      {"q", &in.q},
      {"k", &in.k},
      {"v", &in.v},
      {"mask", &in.mask},
      {"bias", &in.bias},
      {"k_pages", &in.k_pages},
      {"v_pages", &in.v_pages},
      {"block_table", &in.block_table},
      {"kv_rows", &in.kv_rows},
      {"q_rows", &in.q_rows},
  };
  for (const auto& [name, t] : inputs) {
    if (overlaps(out, *t)) {
      fail(ErrorKind::InvalidArgument,
           std::string(backend) + ": out shares memory with " + name + " (the forward reads " + name +
               " while it writes out): pass an output that overlaps no input",
           {"out"});
    }
  }
}

}  // namespace attnprof
