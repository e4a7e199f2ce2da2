// What the packed-batch (variable-length) tests share, on the CPU
// (tests/cpu/varlen_test.cpp) and on the GPU (tests/gpu/flash_sequences_test.cpp,
// tests/gpu/cudnn_ragged_test.cpp): the length sets they run, so that a case
// added here reaches every backend, and the float64 check of one output or
// gradient, so that every backend is held to the same acceptance.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnprof/dtype.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"

namespace attnprof::testing {

using Lens = std::vector<std::int64_t>;
// A packed batch's query lengths and key lengths, one of each per sequence.
using LengthSet = std::pair<Lens, Lens>;

// The random sets of a suite: `count` of them from `seed`, each of
// 2 + rng() % `more_sequences` sequences, with 0 .. max_len - 1 queries (one
// more in the first, so never all empty) and 1 .. max_len keys.
struct RandomLengths {
  std::uint32_t seed;
  int more_sequences;
  std::int64_t max_len;
  int count = 2;
};

// The sets every packed-batch suite runs, then its own `extra` ones (one
// sequence alone, lengths across its kernels' tile edges), then its random
// ones: an empty and a one-row sequence among equal lengths, more keys than
// queries and fewer, keys without queries and queries without keys.
inline std::vector<LengthSet> length_sets(std::vector<LengthSet> extra, const RandomLengths& random) {
  std::vector<LengthSet> sets = {
      {{1, 0, 70, 5}, {1, 0, 70, 5}},  // equal lengths, an empty and a one-row sequence
      {{33, 1, 130}, {80, 7, 129}},    // more keys than queries, and fewer
      {{64, 0, 3}, {64, 20, 0}},       // keys without queries, queries without keys
  };
  for (LengthSet& s : extra) sets.push_back(std::move(s));
  std::mt19937 rng(random.seed);
  for (int s = 0; s < random.count; ++s) {
    Lens q, kv;
    const int n = 2 + static_cast<int>(rng() % static_cast<unsigned>(random.more_sequences));
    for (int b = 0; b < n; ++b) {
      q.push_back(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(random.max_len)));
      kv.push_back(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(random.max_len)) + 1);
    }
    q[0] += 1;  // never all empty
    sets.emplace_back(q, kv);
  }
  return sets;
}

// The CPU's sets, which cudnn runs too: one sequence (the dense problem),
// five unequal ones, and two random sets of up to 5 sequences of up to 150 rows.
inline std::vector<LengthSet> length_sets() {
  return length_sets({{{200}, {150}}, {{17, 65, 128, 2, 90}, {17, 65, 128, 2, 90}}},
                     {.seed = 22, .more_sequences = 4, .max_len = 150});
}

// One output's (or gradient's) float64 check: no NaN row unless `nan_ok`
// (a backend documented to give NaN on fully masked rows), some rows
// checked, and fp32 within 1e-5 relative, the 16-bit dtypes within accept()'s
// tolerance.
inline void expect_accurate(const Problem& p, const ErrorStats& e, const std::string& what, bool nan_ok = false) {
  if (!nan_ok) EXPECT_EQ(e.nan_rows, 0) << what;
  EXPECT_GT(e.rows_checked, 0) << what;
  if (p.dtype == DType::F32) {
    EXPECT_LT(e.rel, 1e-5) << what;
  } else {
    const Acceptance a = accept(p.dtype, e, std::nullopt, nan_ok);
    EXPECT_TRUE(a.pass) << what << ": " << a.why << ", max abs " << e.max_abs;
  }
}

}  // namespace attnprof::testing
