// The CPU flash kernel tests' accuracy rule (flash_isa_test.cpp, the emulated
// suites of flash_emulated_test.h): FP32 far under 1e-4 (1e-5, as the other
// CPU flash tests), 16-bit by accept(); no NaN rows, some rows checked.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"
#include "common/test_problem.h"

namespace attnprof::testing {

inline void expect_flash_accurate(const Problem& p, const ErrorStats& e, const std::string& what) {
  EXPECT_EQ(e.nan_rows, 0) << what;
  EXPECT_GT(e.rows_checked, 0) << what;
  if (p.dtype == DType::F32) {
    EXPECT_LT(e.rel, 1e-5) << what << ": rel " << e.rel;
  } else {
    const Acceptance a = accept(p.dtype, e, std::nullopt, false);
    EXPECT_TRUE(a.pass) << what << ": " << a.why;
  }
}

// `flash`'s training forward then backward on fresh inputs (outputs and
// gradients poisoned first), each gradient against float64 on every row.
inline GradientErrors flash_backward_errors(Backend& flash, const Problem& p, std::uint64_t seed) {
  Inputs in = make_inputs(p, seed, cpu_allocator());
  const Tensor dout = make_dout(p, seed, cpu_allocator());
  Tensor out = nan_tensor(p, p.heads, p.seq);
  Saved saved;
  Gradients g{nan_tensor(p, p.heads, p.seq), nan_tensor(p, p.kv_heads, p.kv_seq), nan_tensor(p, p.kv_heads, p.kv_seq)};
  RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
  flash.forward_train(p, in, out, saved, ctx);
  flash.backward(p, in, out, dout, saved, g, ctx);
  return check_gradients_against_reference(p, in, dout, g, sample_rows(p, 1 << 20), sample_kv_rows(p, 1 << 20));
}

}  // namespace attnprof::testing
