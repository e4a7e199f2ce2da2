// The CPU flash kernels at every instruction-set level on the inputs that
// take paths of their own (flash_isa_test.cpp has the rest): fp8 (e4m3) inputs,
// against float64 and bit for bit against the bf16 forward, and decoding (a
// few queries a sequence, one item per KV head), against float64 with its
// backward. A level this CPU cannot run is skipped with what it lacks.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/flash_kernels.h"
#include "common/test_problem.h"
#include "cpu/flash_accuracy.h"
#include "cpu/flash_isa_fixture.h"

namespace attnprof {
namespace {

using cpu::CpuIsa;
using testing::Case;
using testing::ForceIsa;

class FlashIsaInputs : public testing::FlashIsa {};

// c's problem with a soft cap (0: none) and a paged cache of pages of `page` keys (0: contiguous).
// Outputs of a and b (the same sizes) whose bits differ.
std::int64_t bits_apart(const Tensor& a, const Tensor& b) {
  std::int64_t differ = 0;
  testing::for_each_index(a, [&](auto i0, auto i1, auto i2, auto i3) {
    differ +=
        std::bit_cast<std::uint32_t>(a.get(i0, i1, i2, i3)) != std::bit_cast<std::uint32_t>(b.get(i0, i1, i2, i3));
  });
  return differ;
}

Problem capped_or_paged(const Case& c, double softcap, std::int64_t page) {
  Problem p = testing::to_problem(c.shape, c.dtype, c.mask);
  p.softcap = softcap;
  if (page > 0) {
    p.kv_cache = KvCache::Paged;
    p.page_size = page;
  }
  return p;
}

// t (e4m3) times its descale, as bf16: exact for a descale that is a power of two.
Tensor dequantized_bf16(const Tensor& t, float descale) {
  Tensor r = Tensor::empty(t.sizes(), DType::BF16, cpu_allocator());
  testing::for_each_index(t, [&](auto a, auto b, auto c, auto d) { r.set(a, b, c, d, t.get(a, b, c, d) * descale); });
  return r;
}

// FP8 (e4m3 inputs, bf16 output). The kernels multiply the stored values
// (bf16 products take them exactly: every e4m3 value is a bf16 value; the
// FP32 ones widen them) with q's and k's descales in the scores' scale and
// v's on O. Against float64 of the dequantized inputs the error is then
// bf16's (P rounded for P V), judged by the bf16 rule; and with descales that
// are powers of two the output is, bit for bit, the bf16 forward's on the
// dequantized inputs (every scaling exact), so a descale missed, applied
// twice or in the wrong place shows. Every mask kind, a soft cap, grouped
// heads, the tiles' head dims and the others, a paged cache and a packed batch.
TEST_P(FlashIsaInputs, Fp8ForwardMatchesFloat64AndTheBf16Forward) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  const auto& kernels = cpu::flash::kernels_of(GetParam());
  struct Fp8Case {
    Case c;
    double softcap = 0;
    std::int64_t page = 0;                  // a paged cache of pages of this many keys
    std::vector<std::int64_t> packed = {};  // a packed batch of these lengths
  };
  const std::vector<Fp8Case> fp8_cases = {
      {{"causal", {.batch = 2, .heads = 2, .seq = 200, .head_dim = 64}, DType::F8E4M3, MaskKind::Causal}},
      {{"none_hdim128", {.heads = 2, .seq = 160, .kv_seq = 300, .head_dim = 128}, DType::F8E4M3, MaskKind::None}},
      {{"gqa_window_capped",
        {.heads = 4, .kv_heads = 2, .seq = 170, .head_dim = 64, .window = 50},
        DType::F8E4M3,
        MaskKind::SlidingWindow},
       30.0},
      {{"hdim40", {.heads = 1, .seq = 40, .kv_seq = 77, .head_dim = 40}, DType::F8E4M3, MaskKind::Causal}},
      {{"hdim_odd", {.heads = 1, .seq = 33, .kv_seq = 47, .head_dim = 5}, DType::F8E4M3, MaskKind::Causal}},
      {{"paged_bottom_right",
        {.heads = 2, .seq = 100, .kv_seq = 700, .head_dim = 64},
        DType::F8E4M3,
        MaskKind::CausalBottomRight},
       0.0,
       64},
      {{"packed", {.heads = 2, .head_dim = 64}, DType::F8E4M3, MaskKind::Causal}, 0.0, 0, {300, 17, 0, 129}},
  };
  for (const Fp8Case& fc : fp8_cases) {
    const std::string what = std::string(cpu::isa_name(GetParam())) + " fp8 " + fc.c.name;
    Problem p = capped_or_paged(fc.c, fc.softcap, fc.page);
    if (!fc.packed.empty()) p = varlen_problem(p, fc.packed);
    p.normalize();
    p.validate();
    const Eligibility el = flash->eligibility(p);
    ASSERT_TRUE(el.eligible) << what << ": " << el.reason;
    EXPECT_NE(el.reason.find("e4m3 inputs read as they are stored"), std::string::npos) << what << ": " << el.reason;
    const char* products = kernels.forward_repacks_heads(p) ? "e4m3 inputs as bf16 (exact)" : "and e4m3 inputs widened";
    EXPECT_NE(el.reason.find(products), std::string::npos) << what << ": " << el.reason;

    Inputs in = make_inputs(p, 31, cpu_allocator());
    ASSERT_EQ(in.q.dtype(), DType::F8E4M3) << what;
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    Tensor out = testing::nan_tensor(p.q_dims(), DType::BF16);
    flash->forward(p, in, out, ctx);
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    EXPECT_EQ(e.nan_rows, 0) << what;
    const Acceptance a = accept(DType::BF16, e, std::nullopt, false);
    EXPECT_TRUE(a.pass) << what << ": " << a.why;

    // Powers of two: the same stored values, scaled exactly.
    in.q_descale = 0x1p-7f, in.k_descale = 0x1p-6f, in.v_descale = 0x1p-8f;
    Problem twin_p = p;
    twin_p.dtype = DType::BF16;
    Inputs twin = in;
    twin.q = dequantized_bf16(in.q, in.q_descale);
    for (auto [from, to, s] :
         {std::tuple{&in.k, &twin.k, in.k_descale}, std::tuple{&in.v, &twin.v, in.v_descale},
          std::tuple{&in.k_pages, &twin.k_pages, in.k_descale}, std::tuple{&in.v_pages, &twin.v_pages, in.v_descale}}) {
      if (from->defined()) *to = dequantized_bf16(*from, s);
    }
    Tensor out8 = testing::nan_tensor(p.q_dims(), DType::BF16), out16 = testing::nan_tensor(p.q_dims(), DType::BF16);
    flash->forward(p, in, out8, ctx);
    flash->forward(twin_p, twin, out16, ctx);
    EXPECT_EQ(bits_apart(out8, out16), 0) << what << ": of " << out8.numel() << " outputs";
  }
}

// Decoding (flash_tiles.h's decodes(): at most 4 queries a sequence): one
// item per (sequence, KV head), its query heads' rows together, against
// float64 at every level: every dtype (fp8 with its descales), one to four
// queries, grouped heads from 1 to 16 a KV head (64 rows, the most), every
// structural mask, rows every key of which is masked (zeros), head dims that
// are no whole vector, a soft cap, a paged cache; and its log-sum-exp, which
// a backward over the same problem reads. A fifth query takes the tiled items.
// A sequence that sees more than kDecodeChunkKeys keys runs as ranges merged
// in key order (the "ranges_" cases: the last range a few keys, a window that
// hides whole ranges from some rows, pages): the same bits on 1, 2 or 3
// threads, however the items fall on them.
TEST_P(FlashIsaInputs, DecodeMatchesFloat64) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  struct DecodeCase {
    Case c;
    double softcap = 0;
    std::int64_t page = 0;
  };
  const std::vector<DecodeCase> decode_cases = {
      {{"gqa_bf16",
        {.batch = 2, .heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 300, .head_dim = 128},
        DType::BF16,
        MaskKind::None}},
      {{"causal_3_fp32", {.heads = 4, .seq = 3, .kv_seq = 200, .head_dim = 64}, DType::F32, MaskKind::Causal}},
      {{"mqa_bottom_right_f16",
        {.heads = 8, .kv_heads = 1, .seq = 4, .kv_seq = 190, .head_dim = 64},
        DType::F16,
        MaskKind::CausalBottomRight}},
      {{"window_hdim72_bf16",
        {.heads = 4, .kv_heads = 2, .seq = 2, .kv_seq = 500, .head_dim = 72, .window = 50},
        DType::BF16,
        MaskKind::SlidingWindow}},
      {{"fp8", {.heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 257, .head_dim = 128}, DType::F8E4M3, MaskKind::None}},
      {{"capped_hdim5_fp32", {.heads = 2, .seq = 1, .kv_seq = 130, .head_dim = 5}, DType::F32, MaskKind::None}, 20.0},
      {{"64_rows_bf16",
        {.heads = 32, .kv_heads = 2, .seq = 4, .kv_seq = 99, .head_dim = 64},
        DType::BF16,
        MaskKind::CausalBottomRight}},
      {{"fully_masked_rows_fp32",
        {.heads = 2, .seq = 4, .kv_seq = 2, .head_dim = 32},
        DType::F32,
        MaskKind::CausalBottomRight}},
      {{"paged_bf16",
        {.batch = 3, .heads = 4, .kv_heads = 2, .seq = 1, .kv_seq = 333, .head_dim = 64},
        DType::BF16,
        MaskKind::CausalBottomRight},
       0.0,
       16},
      {{"ranges_gqa_bf16",
        {.batch = 2, .heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 1300, .head_dim = 128},
        DType::BF16,
        MaskKind::None}},
      {{"ranges_bottom_right_fp32",
        {.heads = 4, .kv_heads = 1, .seq = 4, .kv_seq = 1025, .head_dim = 64},
        DType::F32,
        MaskKind::CausalBottomRight}},
      {{"ranges_window_f16",
        {.heads = 4, .kv_heads = 2, .seq = 3, .kv_seq = 1800, .head_dim = 72, .window = 700},
        DType::F16,
        MaskKind::SlidingWindow}},
      {{"ranges_capped_bf16", {.heads = 2, .seq = 2, .kv_seq = 1100, .head_dim = 64}, DType::BF16, MaskKind::None},
       30.0},
      {{"ranges_paged_bf16",
        {.batch = 2, .heads = 4, .kv_heads = 1, .seq = 2, .kv_seq = 1111, .head_dim = 64},
        DType::BF16,
        MaskKind::CausalBottomRight},
       0.0,
       16},
  };
  for (const DecodeCase& dc : decode_cases) {
    const std::string what = std::string(cpu::isa_name(GetParam())) + " decode " + dc.c.name;
    Problem p = capped_or_paged(dc.c, dc.softcap, dc.page);
    p.normalize();
    p.validate();
    ASSERT_TRUE(cpu::flash::decodes(p)) << what;
    const Eligibility el = flash->eligibility(p);
    ASSERT_TRUE(el.eligible) << what << ": " << el.reason;
    EXPECT_NE(el.reason.find("decode: each KV head's keys and values read once"), std::string::npos) << el.reason;
    const Inputs in = make_inputs(p, 41, cpu_allocator());
    Tensor out = testing::nan_tensor(p.q_dims(), output_dtype(p.dtype));
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    flash->forward(p, in, out, ctx);
    if (p.kv_seq > cpu::flash::kDecodeChunkKeys) {
      for (const int threads : {1, 3}) {
        Tensor again = testing::nan_tensor(p.q_dims(), output_dtype(p.dtype));
        RunContext other{.allocator = cpu_allocator(), .threads = threads};
        flash->forward(p, in, again, other);
        EXPECT_EQ(bits_apart(out, again), 0) << what << ": " << threads << " threads against 2";
      }
    }
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    if (is_fp8(p.dtype)) {
      EXPECT_EQ(e.nan_rows, 0) << what;
      const Acceptance a = accept(DType::BF16, e, std::nullopt, false);  // the stored values, FP32 products
      EXPECT_TRUE(a.pass) << what << ": " << a.why;
    } else {
      testing::expect_flash_accurate(p, e, what);
    }
    if (dc.c.dtype == DType::F32 || dc.c.dtype == DType::BF16) {
      if (dc.page > 0) continue;  // a paged cache is inference only
      Problem b = p;
      b.pass = Pass::Backward;
      b.validate();
      const GradientErrors g = testing::flash_backward_errors(*flash, b, 7);
      testing::expect_flash_accurate(b, g.dq, what + " dQ");
      testing::expect_flash_accurate(b, g.dk, what + " dK");
      testing::expect_flash_accurate(b, g.dv, what + " dV");
    }
  }
  Problem five =
      testing::to_problem({.heads = 4, .seq = 5, .kv_seq = 100, .head_dim = 64}, DType::BF16, MaskKind::Causal);
  five.normalize();
  EXPECT_FALSE(cpu::flash::decodes(five));
  EXPECT_EQ(flash->eligibility(five).reason.find("decode:"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Levels, FlashIsaInputs, ::testing::ValuesIn(cpu::kAllCpuIsas),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(cpu::isa_name(info.param));
                         });

}  // namespace
}  // namespace attnprof
