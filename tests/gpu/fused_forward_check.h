// The float64 check of our fused attention forwards (tests/gpu/fused_kernels_test.cpp: the public launchers;
// fused_sm90_choices_test.cu: sm90a kernel choices the defaults leave out): a kernel run on fresh random inputs
// with its output (and lse buffer) poisoned with NaN before the launch, against a float64 CPU reference: every
// element must be written, fully masked rows must be exactly zero (lse +inf), and the error must sit within
// 16-bit rounding.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof::testing::fused {

using attnprof::MaskKind;
using attnprof::cuda::FusedParams;

bool usable_device(std::string* why);

#define SKIP_WITHOUT_SM80()                                                      \
  do {                                                                           \
    std::string why_;                                                            \
    if (!::attnprof::testing::fused::usable_device(&why_)) GTEST_SKIP() << why_; \
  } while (0)

struct Case {
  const char* name;
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  MaskKind mask;
  int window = 0;
  bool bf16 = true;
  bool bshd = false;    // [B, S, H, D] storage: head and row strides swapped
  float scale = 0.f;    // 0: 1/sqrt(head_dim)
  float softcap = 0.f;  // scores c tanh(s / c); 0: none (flash's sm90 kernels only)
};

struct Outcome {
  double rel_error = 0, max_abs = 0;
  std::int64_t nan_count = 0, masked_nonzero = 0, masked_rows = 0;
  // With an lse buffer: the largest |got - ref| / (1 + |ref|) over rows that
  // see a key, NaN (unwritten) entries, and fully masked rows not at +inf.
  double lse_max_err = 0;
  std::int64_t lse_nan = 0, lse_masked_wrong = 0;
};

// A kernel under test: its name in the test names, its launch on the default
// stream, and whether fused_unsupported_reason judges it as flash.
struct Launcher {
  const char* name;
  cudaError_t (*launch)(const FusedParams&);
  bool flash;
};

struct KernelCase {
  Case c;
  Launcher kernel;
};

// Runs one kernel on fresh inputs drawn from `seed` and compares with float64.
void run_case(const Case& c, const Launcher& kernel, std::uint32_t seed, Outcome* out, bool with_lse = false);

// O against float64 on two draws, at bf16's or fp16's tolerance.
void expect_matches_float64(const KernelCase& kc);

// The same with an lse buffer: O, and every row's log-sum-exp.
void expect_lse_matches_float64(const KernelCase& kc);

// The test name of a case: kernel_case.
std::string case_name(const ::testing::TestParamInfo<KernelCase>& info);

}  // namespace attnprof::testing::fused
