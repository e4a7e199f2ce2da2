// Large scores (issue 57 item 6): finite inputs at the edge of the
// documented range (attnprof/limits.h, scores_in_range: 2^30 for bf16,
// 2^126 for fp32), each problem's forward on a backend against float64, and
// bf16 cases past bf16's bound (2^46 to 2^126) that the CPU kernels still
// compute, as they round every product (`cpu_only`: the CUDA fused kernels
// give NaN there). Shared by score_range_test.cpp (every level this CPU runs,
// and the composites), the emulated avx512bf16 and amx units, whose bf16
// kernels take the scale in the softmax's exponent, and the CUDA kernels'
// test (score_range_cuda_test.cpp, the in-range cases).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/limits.h"
#include "attnprof/reference.h"
#include "common/test_problem.h"
#include "cpu/flash_accuracy.h"

namespace attnprof::testing {

struct LargeScoreCase {
  const char* name;
  DType dtype;
  double scale;
  double q_max, k_max;  // q and k uniform in [-q_max, q_max) and [-k_max, k_max): powers of two, exact in bf16
  MaskKind mask;
  bool cpu_only = false;  // past scores_in_range: the CPU's own promise, not every backend's
};

// The range's edges: bf16's 2^30 at scale 1 (q and k up to 2^12) and at
// either end of the scale's own range, fp32's 2^126 at both ends. Past
// bf16's bound, the CPU's: bf16 inputs near 2^20 at scale 1 gave NaN rows on
// the avx512bf16 kernel (the scores' max rounded below a score's exact
// product in the exponent's FMA, by half an ulp of 2^44: P = 2^(2^17) =
// inf), and 2^126 with the scale at either end.
inline const std::vector<LargeScoreCase>& large_score_cases() {
  static const std::vector<LargeScoreCase> c = {
      {"bf16_edge_scale_1", DType::BF16, 1.0, 0x1p12, 0x1p12, MaskKind::None},
      {"bf16_edge_scale_1_causal", DType::BF16, 1.0, 0x1p12, 0x1p12, MaskKind::Causal},
      {"bf16_edge_scale_2^-60", DType::BF16, limits::kScaleAbsMin, 0x1p12, 0x1p12, MaskKind::None},
      {"bf16_edge_scale_2^60", DType::BF16, limits::kScaleAbsMax, 0x1p-40, 0x1p4, MaskKind::Causal},
      {"fp32_edge_scale_2^60", DType::F32, limits::kScaleAbsMax, 0x1p40, 0x1p20, MaskKind::None},
      {"fp32_edge_scale_-2^60", DType::F32, -limits::kScaleAbsMax, 0x1p40, 0x1p20, MaskKind::Causal},
      {"bf16_q_k_2^20_scale_1", DType::BF16, 1.0, 0x1p20, 0x1p20, MaskKind::None, true},
      {"bf16_q_k_2^20_scale_1_causal", DType::BF16, 1.0, 0x1p20, 0x1p20, MaskKind::Causal, true},
      {"bf16_q_k_2^50_scale_2^-60", DType::BF16, limits::kScaleAbsMin, 0x1p50, 0x1p50, MaskKind::None, true},
      {"bf16_q_k_2^126_scale_2^60", DType::BF16, limits::kScaleAbsMax, 0x1p40, 0x1p20, MaskKind::Causal, true},
  };
  return c;
}

inline Problem large_score_problem(const LargeScoreCase& c) {
  Problem p =
      to_problem(Shape{.heads = 2, .seq = 40, .kv_seq = 150, .head_dim = 64, .scale = c.scale}, c.dtype, c.mask);
  p.validate();
  return p;
}

// t's elements times a power of two (exact).
inline void scale_tensor(Tensor& t, float by) {
  const std::int64_t n = t.numel();
  if (t.dtype() == DType::F32) {
    for (std::int64_t i = 0; i < n; ++i) t.data_as<float>()[i] *= by;
  } else {
    auto* x = t.data_as<std::uint16_t>();
    for (std::int64_t i = 0; i < n; ++i) x[i] = float_to_bf16(bf16_to_float(x[i]) * by);
  }
}

inline Inputs large_score_inputs(const LargeScoreCase& c, const Problem& p) {
  Inputs in = make_inputs(p, 57, cpu_allocator());
  scale_tensor(in.q, static_cast<float>(c.q_max));
  scale_tensor(in.k, static_cast<float>(c.k_max));
  return in;
}

// b's forward (a CPU backend) on each case, the CPU-only ones too: no NaN
// row (the reference has none), and, where `accurate`, within the backend's
// tolerance of float64.
inline void expect_large_scores_computed(Backend& b, const std::string& what, bool accurate) {
  for (const LargeScoreCase& c : large_score_cases()) {
    const Problem p = large_score_problem(c);
    ASSERT_EQ(limits::scores_in_range(c.dtype, c.scale, p.head_dim, c.q_max, c.k_max), !c.cpu_only) << c.name;
    ASSERT_TRUE(b.eligibility(p).eligible) << what << " " << c.name;
    const Inputs in = large_score_inputs(c, p);
    Tensor out = nan_tensor(p, p.heads, p.seq);
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    b.forward(p, in, out, ctx);
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    const std::string label = what + " " + c.name;
    EXPECT_EQ(e.nan_rows, 0) << label;
    if (accurate) expect_flash_accurate(p, e, label);
  }
}

}  // namespace attnprof::testing
