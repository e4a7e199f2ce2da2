// The CPU flash kernel tests' accuracy rule (flash_isa_test.cpp, the emulated
// suites of flash_emulated_test.h): FP32 far under 1e-4 (1e-5, as the other
// CPU flash tests), 16-bit by accept(); no NaN rows, some rows checked.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "attnprof/problem.h"
#include "attnprof/reference.h"

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

}  // namespace attnprof::testing
