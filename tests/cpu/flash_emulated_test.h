// The AVX-512, AVX512-BF16 and AMX kernels of the CPU flash run here over
// plain C++ stand-ins of their intrinsics (avx512_emulation.h), so their
// layouts, register and tile blocking, tails and repacked caches are checked
// against float64 on any machine (this dev box has AVX2 only; CI likewise);
// the real instructions run in FlashIsa (flash_isa_test.cpp) where the CPU
// has them. Each including test unit first compiles one level's kernels
// (flash_isa_table.h) with ATTNPROF_FLASH_EMULATE, then defines
// ATTNPROF_EMULATED_SUITE and includes this.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/flash_kernels.h"
#include "common/test_problem.h"
#include "cpu/flash_accuracy.h"
#include "cpu/nan_cases.h"
#include "cpu/packed_bits.h"

namespace attnprof {
namespace {

struct EmulatedCase {
  const char* name;
  testing::Shape shape;
  DType dtype;
  MaskKind mask;
};

const std::vector<EmulatedCase>& emulated_cases() {
  static const std::vector<EmulatedCase> c = {
      {"none_fp32", {.batch = 1, .heads = 2, .seq = 130, .kv_seq = 200, .head_dim = 64}, DType::F32, MaskKind::None},
      {"causal_hdim40_fp32", {.heads = 2, .seq = 150, .head_dim = 40}, DType::F32, MaskKind::Causal},
      {"window_fp32", {.heads = 1, .seq = 200, .head_dim = 128, .window = 70}, DType::F32, MaskKind::SlidingWindow},
      {"causal_bf16", {.heads = 2, .seq = 200, .head_dim = 64}, DType::BF16, MaskKind::Causal},
      {"none_hdim128_bf16", {.heads = 1, .seq = 100, .kv_seq = 290, .head_dim = 128}, DType::BF16, MaskKind::None},
      {"gqa_window_bf16",
       {.heads = 4, .kv_heads = 2, .seq = 150, .head_dim = 64, .window = 51},
       DType::BF16,
       MaskKind::SlidingWindow},
      {"bottom_right_hdim32_bf16",
       {.heads = 2, .seq = 70, .kv_seq = 199, .head_dim = 32},
       DType::BF16,
       MaskKind::CausalBottomRight},
      {"hdim_odd_pairs_bf16", {.heads = 1, .seq = 40, .kv_seq = 77, .head_dim = 40}, DType::BF16, MaskKind::Causal},
      // 64-key backward items (past head_dim 128): tails of 19 keys, a lone tile row.
      {"gqa_none_hdim192_bf16",
       {.heads = 2, .kv_heads = 1, .seq = 45, .kv_seq = 147, .head_dim = 192},
       DType::BF16,
       MaskKind::None},
      {"hdim5_bf16", {.heads = 1, .seq = 33, .kv_seq = 47, .head_dim = 5}, DType::BF16, MaskKind::Causal},
      // A decode over three key ranges (flash_tiles.h's kDecodeChunkKeys), merged in key order.
      {"decode_ranges_bf16",
       {.heads = 4, .kv_heads = 1, .seq = 2, .kv_seq = 1100, .head_dim = 64},
       DType::BF16,
       MaskKind::CausalBottomRight},
  };
  return c;
}

// The emulated table in the drivers' place for one test.
struct UseKernels {
  explicit UseKernels(const cpu::flash::Kernels& k) { cpu::flash::set_kernels_for_testing(&k); }
  ~UseKernels() { cpu::flash::set_kernels_for_testing(nullptr); }
  UseKernels(const UseKernels&) = delete;
  UseKernels& operator=(const UseKernels&) = delete;
};

void run_emulated_forward(const cpu::flash::Kernels& k, const std::string& level) {
  const UseKernels use(k);
  auto flash = cpu::make_flash();
  for (const EmulatedCase& c : emulated_cases()) {
    Problem p = testing::to_problem(c.shape, c.dtype, c.mask);
    p.validate();
    ASSERT_TRUE(flash->eligibility(p).eligible) << c.name;
    const Inputs in = make_inputs(p, 21, cpu_allocator());
    Tensor out = testing::nan_tensor(p, p.heads, p.seq);
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    flash->forward(p, in, out, ctx);
    testing::expect_flash_accurate(p, check_against_reference(p, in, out, sample_rows(p, 1 << 20)),
                                   level + " (emulated) " + c.name + ": " + k.forward_products(p));
  }
}

// NaN and inf in q, k, an FP8 k and a bias reach the output as in the
// float64 reference (nan_cases.h), through the level's exp2, tanh and stores.
void run_emulated_nan(const cpu::flash::Kernels& k, const std::string& level) {
  const UseKernels use(k);
  auto flash = cpu::make_flash();
  testing::expect_nan_passes_through(*flash, level + " (emulated)");
}

void run_emulated_backward(const cpu::flash::Kernels& k, const std::string& level) {
  const UseKernels use(k);
  auto flash = cpu::make_flash();
  for (const EmulatedCase& c : emulated_cases()) {
    Problem p = testing::to_problem(c.shape, c.dtype, c.mask);
    p.pass = Pass::Backward;
    p.validate();
    const GradientErrors e = testing::flash_backward_errors(*flash, p, 9);
    const std::string what = level + " (emulated) " + c.name;
    testing::expect_flash_accurate(p, e.dq, what + " dQ");
    testing::expect_flash_accurate(p, e.dk, what + " dK");
    testing::expect_flash_accurate(p, e.dv, what + " dV");
  }
}

// A packed call is the per-sequence dense calls, bit for bit, with the
// level's kernels (packed_bits.h): sequences of 1 to 3 queries (which decode
// alone) beside tiled ones, bf16 (the level's bf16 products) and FP32. Then
// decoding sequences over several key ranges (kDecodeChunkKeys), in the
// deterministic order: their dQ sums many key blocks, whose adds otherwise
// follow thread timing (flash_backward.cpp).
void run_emulated_packed_bits(const cpu::flash::Kernels& k, const std::string& level) {
  const UseKernels use(k);
  auto flash = cpu::make_flash();
  for (const DType dtype : {DType::BF16, DType::F32}) {
    Problem base = testing::to_problem({.heads = 4, .kv_heads = 2, .head_dim = 64}, dtype, MaskKind::CausalBottomRight);
    Problem p = varlen_problem(base, {70, 1, 0, 3, 2}, {90, 1, 5, 77, 150});
    p.pass = Pass::Train;
    p.normalize();
    testing::expect_packed_is_dense_calls(*flash, p, level + " (emulated)");
    Problem ranges = varlen_problem(base, {2, 1, 3}, {1100, 40, 600});
    ranges.pass = Pass::Train;
    ranges.deterministic = true;
    ranges.normalize();
    testing::expect_packed_is_dense_calls(*flash, ranges, level + " (emulated)");
  }
}

// The bf16 ceiling's product (Kernels::bf16_gemm) against float64 on the
// same bf16 values.
void run_emulated_bf16_gemm(const cpu::flash::Kernels& k) {
  ASSERT_NE(k.bf16_gemm, nullptr);
  const std::int64_t m = 64, n = 64, depth = 96;
  std::vector<std::uint16_t> a(static_cast<std::size_t>(m * depth));
  std::vector<std::uint16_t> b(static_cast<std::size_t>(depth * n));
  std::uint32_t state = 777;
  const auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return float_to_bf16(static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f);
  };
  for (auto& x : a) x = next();
  for (auto& x : b) x = next();
  std::vector<std::uint32_t> b_vnni(static_cast<std::size_t>(depth / 2 * n));
  for (std::int64_t p = 0; p < depth / 2; ++p)
    for (std::int64_t c = 0; c < n; ++c)
      b_vnni[static_cast<std::size_t>(p * n + c)] =
          b[static_cast<std::size_t>(2 * p * n + c)] |
          (std::uint32_t{b[static_cast<std::size_t>((2 * p + 1) * n + c)]} << 16);
  std::vector<float> c(static_cast<std::size_t>(m * n), -1.0f);
  k.bf16_gemm(a.data(), b_vnni.data(), c.data(), m, n, depth);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (std::int64_t d = 0; d < depth; ++d)
        want += static_cast<double>(bf16_to_float(a[static_cast<std::size_t>(i * depth + d)])) *
                bf16_to_float(b[static_cast<std::size_t>(d * n + j)]);
      ASSERT_NEAR(c[static_cast<std::size_t>(i * n + j)], want, 1e-4) << i << ", " << j;
    }
}

}  // namespace
}  // namespace attnprof
