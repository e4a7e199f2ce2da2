// What the packed-batch (variable-length) and soft-cap tests share, on the CPU
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
#include "attnprof/varlen.h"

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

// A packed-batch suite's configuration (one per test instance): the mask,
// heads, head dim, window and dtype its length sets run at; deterministic
// orders the backward's dQ.
struct PackedConfig {
  const char* name;
  MaskKind mask;
  std::int64_t heads, kv_heads, head_dim, window;
  DType dtype;
  bool deterministic = false;
};

// c's packed problem on the lengths q and kv (varlen_problem), on `device`,
// for `pass`: normalized and validated (deterministic only with a backward:
// the forward has nothing to order).
inline Problem packed_problem(const PackedConfig& c, const Lens& q, const Lens& kv, Device device, Pass pass) {
  Problem base{.heads = c.heads,
               .kv_heads = c.kv_heads,
               .head_dim = c.head_dim,
               .dtype = c.dtype,
               .device = device,
               .mask = c.mask,
               .window = c.window};
  base.pass = pass;
  base.deterministic = c.deterministic && pass != Pass::Forward;
  Problem p = varlen_problem(base, q, kv);
  p.normalize();
  p.validate();
  return p;
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

// The acceptance against a yardstick the test measured itself (the soft-cap
// suites: math's error on the same problem, or the backend's own without the
// cap where that is larger): no NaN row, FP32 under f32_limit, 16-bit dtypes
// accept()'s rule of 2 x yardstick + floor. *why says which.
inline bool tolerated(const Problem& p, const ErrorStats& e, double yardstick, std::string* why,
                      double f32_limit = 1e-4) {
  if (e.nan_rows != 0) {
    *why = std::to_string(e.nan_rows) + " rows with NaN";
    return false;
  }
  if (p.dtype == DType::F32) {
    *why = "rel " + std::to_string(e.rel);
    return e.rel < f32_limit;
  }
  const Acceptance a = accept(p.dtype, e, yardstick, false);
  *why = a.why;
  return a.pass;
}

}  // namespace attnprof::testing
