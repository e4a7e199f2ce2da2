// NaN and inf pass through attention as they pass through PyTorch's SDPA and
// the float64 reference: a NaN or inf in q, in k, a NaN byte (0x7F) in an FP8
// k, a NaN in a bias. Each case poisons one element of fresh inputs, runs a
// backend into an output filled with a finite sentinel (so a row the backend
// never wrote cannot pass as NaN) and asks the reference check for no
// difference: NaN exactly where the reference has NaN, zeros on fully masked
// rows (a backend that documents NaN there may give NaN), and the rest within
// the usual tolerance. Shared by nan_passthrough_test.cpp (every CPU backend,
// every flash level this CPU runs) and the emulated flash suites.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "common/test_problem.h"

namespace attnprof::testing {

struct NanCase {
  const char* name;
  Shape shape;
  DType dtype;
  MaskKind mask;
  double softcap = 0;
  bool reference_has_nan = true;  // false: the case checks that nothing becomes NaN
  std::function<void(Inputs&)> poison;
};

inline const std::vector<NanCase>& nan_cases() {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const Shape two_blocks{.heads = 2, .seq = 100, .head_dim = 64};
  static const std::vector<NanCase> cases = {
      {"q_nan_causal_fp32", two_blocks, DType::F32, MaskKind::Causal, 0, true,
       [=](Inputs& in) { in.q.set(0, 1, 70, 5, kNaN); }},
      {"q_nan_none_bf16", two_blocks, DType::BF16, MaskKind::None, 0, true,
       [=](Inputs& in) { in.q.set(0, 0, 3, 60, kNaN); }},
      {"q_inf_none_bf16", two_blocks, DType::BF16, MaskKind::None, 0, true,
       [=](Inputs& in) { in.q.set(0, 0, 10, 3, kInf); }},
      {"q_nan_softcap_fp32", two_blocks, DType::F32, MaskKind::Causal, 30, true,
       [=](Inputs& in) { in.q.set(0, 0, 90, 1, kNaN); }},
      {"k_nan_causal_bf16", two_blocks, DType::BF16, MaskKind::Causal, 0, true,
       [=](Inputs& in) { in.k.set(0, 0, 80, 7, kNaN); }},
      {"k_inf_window_fp32",
       {.heads = 2, .seq = 100, .head_dim = 64, .window = 30},
       DType::F32,
       MaskKind::SlidingWindow,
       0,
       true,
       [=](Inputs& in) { in.k.set(0, 1, 50, 2, kInf); }},
      {"k_neginf_none_fp32", two_blocks, DType::F32, MaskKind::None, 0, true,
       [=](Inputs& in) { in.k.set(0, 0, 20, 9, -kInf); }},
      // Rows 0..9 see no key (zeros); rows 13 on see the NaN key.
      {"k_nan_fully_masked_rows_bf16",
       {.heads = 1, .seq = 20, .kv_seq = 10, .head_dim = 64},
       DType::BF16,
       MaskKind::CausalBottomRight,
       0,
       true,
       [=](Inputs& in) { in.k.set(0, 0, 3, 1, kNaN); }},
      {"bias_nan_fp32", two_blocks, DType::F32, MaskKind::Bias, 0, true,
       [=](Inputs& in) { in.bias.set(0, 0, 4, 2, kNaN); }},
      // A bias of -inf on every key of a row masks it: zeros, not NaN.
      {"bias_row_all_neginf_bf16", two_blocks, DType::BF16, MaskKind::Bias, 0, false,
       [=](Inputs& in) {
         for (std::int64_t j = 0; j < in.bias.size(3); ++j) in.bias.set(0, 0, 6, j, -kInf);
       }},
      {"fp8_k_nan_byte_causal", two_blocks, DType::F8E4M3, MaskKind::Causal, 0, true,
       [](Inputs& in) { in.k.data_as<std::uint8_t>()[in.k.index(0, 0, 20, 4)] = 0x7f; }},
      // A NaN key among the first 8 of a tile: on CUDA's FP8 forward (head dim
      // 128) those columns take their exponentials on the FMA pipe (ex2_fma).
      {"fp8_k_nan_byte_fma_columns_d128",
       {.heads = 2, .seq = 100, .head_dim = 128},
       DType::F8E4M3,
       MaskKind::None,
       0,
       true,
       [](Inputs& in) { in.k.data_as<std::uint8_t>()[in.k.index(0, 1, 3, 9)] = 0x7f; }},
      // Decoding (flash's per-KV-head items): one query a sequence, grouped heads.
      {"decode_k_nan_gqa_bf16",
       {.heads = 4, .kv_heads = 2, .seq = 1, .kv_seq = 150, .head_dim = 64},
       DType::BF16,
       MaskKind::None,
       0,
       true,
       [=](Inputs& in) { in.k.set(0, 1, 90, 3, kNaN); }},
      {"decode_q_nan_fp32",
       {.heads = 2, .seq = 2, .kv_seq = 100, .head_dim = 64},
       DType::F32,
       MaskKind::CausalBottomRight,
       0,
       true,
       [=](Inputs& in) { in.q.set(0, 0, 1, 0, kNaN); }},
  };
  return cases;
}

// A finite value no attention output reaches from inputs in [-1, 1).
constexpr float kSentinel = 4096.0f;

// Runs every case the backend takes; `what` names it in failures.
inline void expect_nan_passes_through(Backend& backend, const std::string& what) {
  int ran = 0;
  for (const NanCase& c : nan_cases()) {
    Problem p = to_problem(c.shape, c.dtype, c.mask);
    p.softcap = c.softcap;
    p.validate();
    if (!backend.eligibility(p).eligible) continue;
    ++ran;
    const std::string label = what + " " + c.name;
    Inputs in = make_inputs(p, 17, cpu_allocator());
    c.poison(in);
    Tensor out = Tensor::empty(p.q_dims(), output_dtype(p.dtype), cpu_allocator());
    for_each_index(out, [&](auto a, auto b, auto i, auto d) { out.set(a, b, i, d, kSentinel); });
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    backend.forward(p, in, out, ctx);
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    EXPECT_EQ(e.nonfinite_hidden, 0) << label << ": finite output where the reference is NaN";
    if (c.reference_has_nan) {
      EXPECT_GT(e.nonfinite_expected, 0) << label << ": the case's reference has no NaN";
    }
    const bool masked_nan_ok = backend.traits().nan_on_fully_masked;
    EXPECT_EQ(e.nan_rows, masked_nan_ok ? e.nan_rows_fully_masked : 0) << label << ": NaN the reference lacks";
    EXPECT_TRUE(std::isfinite(e.rel)) << label;
    const Acceptance a = accept(p.dtype, e, std::nullopt, masked_nan_ok);
    EXPECT_TRUE(a.pass) << label << ": " << a.why;
  }
  EXPECT_GT(ran, 0) << what << " took none of the cases";
}

}  // namespace attnprof::testing
