// The one mask geometry (core/mask_geometry.h) against a brute-force oracle
// (mask_oracle.h, written out apart from it): each row's keys, the keys of a
// block of rows, the rows of a block of keys and which blocks a bound cuts,
// over every structural mask, windows from 1 to INT64_MAX, queries shorter
// and longer than keys (the bottom-right diagonal's offset either way), and
// packed batches; then the problem's counts over packed segments, and every
// CPU backend on windows too long for the old arithmetic (issue 49 item 3).
#include "core/mask_geometry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "attnprof/varlen.h"
#include "backends/cpu/cpu_backends.h"
#include "common/test_problem.h"
#include "common/varlen_cases.h"
#include "mask_oracle.h"

namespace attnprof {
namespace {

using Span = geometry::Span<std::int64_t>;
constexpr std::int64_t kMaxWindow = std::numeric_limits<std::int64_t>::max();

constexpr MaskKind kStructural[] = {MaskKind::None, MaskKind::Causal, MaskKind::CausalBottomRight,
                                    MaskKind::SlidingWindow};

// The windows a problem of seq_k keys is tried at: short ones, the ones
// around the key count where the clamp starts, and the longest.
std::vector<std::int64_t> windows_for(std::int64_t seq_k) {
  return {1,
          2,
          3,
          7,
          seq_k - 1,
          seq_k,
          seq_k + 1,
          2 * seq_k + 5,
          std::int64_t{1} << 31,
          kMaxWindow - seq_k,
          kMaxWindow - 1,
          kMaxWindow};
}

Problem dense(MaskKind mask, std::int64_t window, std::int64_t seq_q, std::int64_t seq_k) {
  return Problem{.batch = 1, .heads = 1, .seq = seq_q, .kv_seq = seq_k, .mask = mask, .window = window};
}

// The smallest span holding every j of [lo, hi) with pred(j), checked to hold
// no gap (a row's keys, a block's rows, are one range), or an empty one.
template <class Pred>
Span oracle_span(std::int64_t lo, std::int64_t hi, Pred pred, const std::string& what) {
  std::int64_t first = -1, last = -1;
  for (std::int64_t j = lo; j < hi; ++j) {
    if (!pred(j)) continue;
    if (first < 0) first = j;
    EXPECT_TRUE(last < 0 || last == j - 1) << what << ": a gap before " << j;
    last = j;
  }
  return first < 0 ? Span{0, 0} : Span{first, last + 1};
}

void expect_same(const Span& got, const Span& want, const std::string& what) {
  if (want.empty()) {
    EXPECT_TRUE(got.empty()) << what << ": got [" << got.begin << ", " << got.end << ")";
  } else {
    EXPECT_EQ(got.begin, want.begin) << what;
    EXPECT_EQ(got.end, want.end) << what;
  }
}

// Whether pred(i, j) holds for some pair of rows [r0, r1) and keys [k0, k1).
template <class Pred>
bool some_pair(Pred pred, std::int64_t r0, std::int64_t r1, std::int64_t k0, std::int64_t k1) {
  for (std::int64_t i = r0; i < r1; ++i)
    for (std::int64_t j = k0; j < k1; ++j)
      if (pred(i, j)) return true;
  return false;
}

struct Lengths {
  std::int64_t seq_q, seq_k;
};
constexpr Lengths kLengths[] = {{1, 1}, {1, 9}, {5, 5}, {7, 20}, {20, 7}, {13, 0}, {0, 6}, {33, 33}, {2, 40}};

TEST(MaskGeometry, EveryViewOfTheBandMatchesTheOracle) {
  for (const MaskKind mask : kStructural) {
    for (const auto [seq_q, seq_k] : kLengths) {
      const std::vector<std::int64_t> windows =
          mask == MaskKind::SlidingWindow ? windows_for(seq_k) : std::vector<std::int64_t>{0};
      for (const std::int64_t window : windows) {
        if (window < 1 && mask == MaskKind::SlidingWindow) continue;
        const Problem p = dense(mask, window, seq_q, seq_k);
        const auto band = geometry::band_of(mask, window, seq_q, seq_k);
        const auto oracle = [&](std::int64_t i, std::int64_t j) { return testing::expected_visible(p, i, j); };
        const std::string shape = std::string(mask_name(mask)) + " window " + std::to_string(window) + " seq " +
                                  std::to_string(seq_q) + "x" + std::to_string(seq_k);
        for (std::int64_t i = 0; i < seq_q; ++i) {
          for (std::int64_t j = 0; j < seq_k; ++j) {
            ASSERT_EQ(geometry::visible(band, i, j), oracle(i, j)) << shape << " row " << i << " key " << j;
          }
          expect_same(geometry::keys_of_row(band, i, seq_k),
                      oracle_span(
                          0, seq_k, [&](std::int64_t j) { return oracle(i, j); }, shape),
                      shape + " row " + std::to_string(i));
        }
        // Blocks of rows and of keys at every start and a few sizes, as the
        // tiled kernels take them (clipped at the last row or key).
        for (const std::int64_t size : {1, 2, 3, 8}) {
          for (std::int64_t r0 = 0; r0 < seq_q; ++r0) {
            const std::int64_t r1 = std::min(seq_q, r0 + size);
            const auto seen = [&](std::int64_t j) { return some_pair(oracle, r0, r1, j, j + 1); };
            expect_same(geometry::keys_of_rows(band, r0, r1, seq_k), oracle_span(0, seq_k, seen, shape),
                        shape + " rows from " + std::to_string(r0));
          }
          for (std::int64_t k0 = 0; k0 < seq_k; ++k0) {
            const std::int64_t k1 = std::min(seq_k, k0 + size);
            const auto sees = [&](std::int64_t i) { return some_pair(oracle, i, i + 1, k0, k1); };
            expect_same(geometry::rows_of_keys(band, k0, k1, seq_q), oracle_span(0, seq_q, sees, shape),
                        shape + " keys from " + std::to_string(k0));
            for (std::int64_t r0 = 0; r0 < seq_q; r0 += size) {
              const std::int64_t r1 = std::min(seq_q, r0 + size);
              const bool cut = some_pair([&](auto a, auto b) { return !oracle(a, b); }, r0, r1, k0, k1);
              EXPECT_EQ(geometry::block_cut_by_band(band, r0, r1, k0, k1), cut)
                  << shape << " rows " << r0 << ".." << r1 << " keys " << k0 << ".." << k1;
            }
          }
        }
      }
    }
  }
}

TEST(MaskGeometry, OneMeaningOfStructural) {
  for (const MaskKind m : {MaskKind::None, MaskKind::Causal, MaskKind::CausalBottomRight, MaskKind::SlidingWindow})
    EXPECT_TRUE(geometry::structural(m)) << mask_name(m);
  EXPECT_FALSE(geometry::structural(MaskKind::Boolean));
  EXPECT_FALSE(geometry::structural(MaskKind::Bias));
  EXPECT_FALSE(geometry::banded(MaskKind::None));
  EXPECT_TRUE(geometry::banded(MaskKind::SlidingWindow));
  EXPECT_TRUE(geometry::top_left(MaskKind::Causal));
  EXPECT_TRUE(geometry::bottom_right(MaskKind::CausalBottomRight));
  EXPECT_FALSE(geometry::bottom_right(MaskKind::None));
  // The band's arithmetic in int (the kernels') holds for the longest window.
  static_assert(geometry::clamp_window(kMaxWindow, 1024) == 1024);
  static_assert(geometry::clamp_window(kMaxWindow, 0) == 1);
  static_assert(geometry::clamp_window(std::int64_t{5}, 1024) == 5);
  static_assert(geometry::band_of(MaskKind::SlidingWindow, kMaxWindow, 3, 1 << 30).lo() == -2);
}

// The problem's counts, dense and packed, summed over the oracle's pairs of
// each sequence at its own lengths.
TEST(MaskGeometry, ProblemCountsMatchTheOracleOverPackedSegments) {
  const std::vector<std::int64_t> q = {3, 0, 9, 1, 12}, kv = {5, 4, 2, 1, 30};
  for (const MaskKind mask : kStructural) {
    const std::vector<std::int64_t> windows = mask == MaskKind::SlidingWindow
                                                  ? std::vector<std::int64_t>{1, 4, 29, 30, 31, kMaxWindow}
                                                  : std::vector<std::int64_t>{0};
    for (const std::int64_t window : windows) {
      Problem p = varlen_problem(Problem{.heads = 1, .head_dim = 8, .mask = mask, .window = window}, q, kv);
      p.normalize();
      std::int64_t pairs = 0, rows = 0, masked = 0;
      for (std::int64_t b = 0; b < p.batch; ++b) {
        const Problem s = p.sequence(b);
        std::int64_t first = s.kv_seq, last = -1;
        for (std::int64_t i = 0; i < s.seq; ++i) {
          std::int64_t row = 0;
          for (std::int64_t j = 0; j < s.kv_seq; ++j) {
            if (!testing::expected_visible(s, i, j)) continue;
            ++row;
            first = std::min(first, j);
            last = std::max(last, j);
          }
          pairs += row;
          masked += row == 0;
        }
        rows += mask == MaskKind::None ? s.kv_seq : std::max<std::int64_t>(0, last - first + 1);
      }
      const std::string what = std::string(mask_name(mask)) + " window " + std::to_string(window);
      EXPECT_EQ(p.visible_pairs(), pairs) << what;
      EXPECT_EQ(p.kv_rows_read(), rows) << what;
      if (mask != MaskKind::None) EXPECT_EQ(p.fully_masked_rows(), masked) << what;
    }
  }
}

// Issue 49 item 3: windows within S of INT64_MAX overflowed the CPU flash's
// band (error about 3 against the reference, dense and packed). Every CPU
// backend must give the unwindowed bottom-right causal answer for them.
TEST(MaskGeometry, LongestWindowsOnEveryCpuBackendDenseAndPacked) {
  for (const bool packed : {false, true}) {
    for (const std::int64_t window : {kMaxWindow, kMaxWindow - 7, std::int64_t{1} << 62, std::int64_t{40}}) {
      Problem p = dense(MaskKind::SlidingWindow, window, 16, 24);
      p.heads = 2;
      p.dtype = DType::F32;
      if (packed) p = varlen_problem(p, {16, 5, 30}, {16, 20, 9});
      p.normalize();
      ASSERT_EQ(testing::refusal(p), "");
      for (const char* name : {"flash", "naive", "naive_inplace", "math"}) {
        const std::string what =
            std::string(name) + (packed ? " packed" : " dense") + " window " + std::to_string(window);
        Backend* b = find_backend(name, Device::Cpu);
        ASSERT_NE(b, nullptr);
        ASSERT_TRUE(eligibility_of(*b, p).eligible) << what;
        const Inputs in = make_inputs(p, 7, cpu_allocator());
        Tensor out = testing::nan_tensor(p.q_dims(), p.dtype);
        RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
        b->forward(p, in, out, ctx);
        const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
        testing::expect_accurate(p, e, what, b->traits().nan_on_fully_masked);
        // The reference itself: the same as with no lower bound at all.
        Problem causal = p;
        causal.mask = MaskKind::CausalBottomRight;
        causal.window = 0;
        EXPECT_LT(check_against_reference(causal, in, out, sample_rows(p, 1 << 20)).rel, 1e-5) << what;
      }
    }
  }
}

// The index arrays' one reading (packed_rows, span_rows), which every CUDA
// kernel makes on the device, against a brute-force oracle: every entry in
// -3 .. rows + 3 around short batches. The rows stay inside the tensors,
// within the longest, one after another when the lengths are exact; exact
// says precisely whether the array was taken as it is.
TEST(MaskGeometry, IndexArraysClampIntoTheTensorsAndSayWhenTheyDid) {
  constexpr int rows = 5, longest = 3;
  // Every cumulative array of 2 sequences with entries in -2 .. rows + 2.
  for (int c0 = -2; c0 <= rows + 2; ++c0) {
    for (int c1 = -2; c1 <= rows + 2; ++c1) {
      for (int c2 = -2; c2 <= rows + 2; ++c2) {
        const int cu[3] = {c0, c1, c2};
        for (int b = 0; b < 2; ++b) {
          const auto r = geometry::packed_rows(cu, b, 2, rows, longest);
          const std::string what = "cu {" + std::to_string(c0) + ", " + std::to_string(c1) + ", " + std::to_string(c2) +
                                   "} sequence " + std::to_string(b);
          EXPECT_LE(0, r.rows.begin) << what;
          EXPECT_LE(r.rows.begin, r.rows.end) << what;
          EXPECT_LE(r.rows.end, rows) << what;
          EXPECT_LE(r.rows.size(), longest) << what;
          const bool in_range = cu[b] >= 0 && cu[b] <= cu[b + 1] && cu[b + 1] <= rows && cu[b + 1] - cu[b] <= longest;
          const bool ends = (b != 0 || cu[0] == 0) && (b != 1 || cu[2] == rows);
          EXPECT_EQ(r.exact, in_range && ends) << what;
          if (in_range) {
            EXPECT_EQ(r.rows.begin, cu[b]) << what;
            EXPECT_EQ(r.rows.end, cu[b + 1]) << what;
          }
        }
      }
    }
  }
  for (int begin = -3; begin <= rows + 3; ++begin) {
    for (int end = -3; end <= rows + 3; ++end) {
      const int pair[2] = {begin, end};
      const auto r = geometry::span_rows(pair, 2, rows);
      const bool in_range = begin >= 0 && begin <= end && end <= rows;
      const std::string what = "(" + std::to_string(begin) + ", " + std::to_string(end) + ")";
      EXPECT_EQ(r.exact, in_range) << what;
      EXPECT_LE(0, r.rows.begin) << what;
      EXPECT_LE(r.rows.begin, r.rows.end) << what;
      EXPECT_LE(r.rows.end, rows) << what;
      if (in_range) EXPECT_EQ(r.rows.begin, begin) << what;
      if (in_range) EXPECT_EQ(r.rows.end, end) << what;
      // An end alone (width 1) reads from row 0.
      const auto e = geometry::span_rows(&end, 1, rows);
      EXPECT_EQ(e.rows.begin, 0) << what;
      EXPECT_EQ(e.rows.end, std::clamp(end, 0, rows)) << what;
      EXPECT_EQ(e.exact, end >= 0 && end <= rows) << what;
    }
  }
  // Wide enough for int64 lengths too (the host's type).
  static constexpr std::int64_t cu64[2] = {0, 4};
  static_assert(geometry::span_rows(cu64, 2, std::int64_t{9}).exact);
  EXPECT_TRUE(geometry::packed_rows(cu64, std::int64_t{0}, std::int64_t{1}, std::int64_t{4}, std::int64_t{4}).exact);
}

}  // namespace
}  // namespace attnprof
