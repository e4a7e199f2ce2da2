// The CPU flash kernels at every instruction-set level (cpu_isa.h), each
// forced with ATTNPROF_CPU_ISA and checked against the float64 reference on
// fresh random inputs with poisoned outputs: forward and backward, fp32 and
// bf16, causal, sliding window, grouped-query heads, odd head dims. A level
// this CPU cannot run is skipped with what it lacks (visible in the test
// output and CTest's summary), and forcing it must be refused in one line
// (the library, the backend's eligibility and the command), never by SIGILL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/flash_kernels.h"
#include "common/test_problem.h"
#include "cpu/flash_accuracy.h"
#include "cpu/flash_isa_fixture.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof {
namespace {

using cpu::CpuIsa;
using testing::Case;
using testing::flash_forward_errors;
using testing::FlashIsa;
using testing::ForceIsa;
using testing::Shape;

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"none_fp32", {.batch = 2, .heads = 2, .seq = 130, .kv_seq = 200, .head_dim = 64}, DType::F32, MaskKind::None},
      {"causal_fp32", {.heads = 3, .seq = 150, .head_dim = 32}, DType::F32, MaskKind::Causal},
      {"window_fp32", {.heads = 2, .seq = 300, .head_dim = 128, .window = 70}, DType::F32, MaskKind::SlidingWindow},
      {"gqa_causal_fp32", {.heads = 8, .kv_heads = 2, .seq = 140, .head_dim = 64}, DType::F32, MaskKind::Causal},
      {"hdim_odd_fp32", {.heads = 1, .seq = 33, .kv_seq = 47, .head_dim = 5}, DType::F32, MaskKind::Causal},
      {"hdim72_bottom_right_fp32",
       {.heads = 2, .seq = 90, .kv_seq = 200, .head_dim = 72},
       DType::F32,
       MaskKind::CausalBottomRight},
      {"causal_bf16", {.batch = 2, .heads = 2, .seq = 200, .head_dim = 64}, DType::BF16, MaskKind::Causal},
      {"none_hdim128_bf16", {.heads = 2, .seq = 160, .kv_seq = 300, .head_dim = 128}, DType::BF16, MaskKind::None},
      {"gqa_window_bf16",
       {.heads = 4, .kv_heads = 2, .seq = 170, .head_dim = 64, .window = 50},
       DType::BF16,
       MaskKind::SlidingWindow},
      {"hdim_odd_bf16", {.heads = 1, .seq = 40, .kv_seq = 77, .head_dim = 40}, DType::BF16, MaskKind::Causal},
      // A negative scale (legal: finite, non-zero) turns the scores' max into their min: the bf16 kernels,
      // which take the scale in the softmax's exponent where they can, must scale first here.
      {"negative_scale_bf16",
       {.heads = 2, .seq = 150, .kv_seq = 190, .head_dim = 64, .scale = -0.3},
       DType::BF16,
       MaskKind::Causal},
      {"causal_f16", {.heads = 2, .seq = 100, .head_dim = 64}, DType::F16, MaskKind::Causal},
  };
  return c;
}

TEST_P(FlashIsa, ForwardMatchesFloat64) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  for (const Case& c : cases()) {
    Problem p = testing::to_problem(c.shape, c.dtype, c.mask);
    p.validate();
    const Eligibility el = flash->eligibility(p);
    ASSERT_TRUE(el.eligible) << c.name << ": " << el.reason;
    EXPECT_NE(el.reason.find("flash cpu kernel: " + std::string(cpu::isa_name(GetParam())) + " (forced"),
              std::string::npos)
        << el.reason;
    const Inputs in = make_inputs(p, 11, cpu_allocator());
    testing::expect_flash_accurate(p, flash_forward_errors(*flash, p, in, 1 << 20),
                                   std::string(cpu::isa_name(GetParam())) + " " + c.name);
  }
}

// Heads whose K and V take more than 2 MiB in FP32, where the FP32 kernels take
// 128 query rows an item (forward_rows_fp32) and run each key block on the
// query columns that see it: ragged last items, every mask kind that
// straddles a 128-row item differently from a 64-row one, a soft cap, and
// fp16 rows widened on the way in. Sampled rows, the last ones among them.
TEST_P(FlashIsa, LongSequenceForwardMatchesFloat64) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  struct LongCase {
    Case c;
    double softcap;
  };
  const std::vector<LongCase> long_cases = {
      {{"causal_4100_fp32", {.heads = 1, .seq = 4100, .head_dim = 64}, DType::F32, MaskKind::Causal}, 0.0},
      {{"bottom_right_capped_fp32",
        {.heads = 2, .kv_heads = 1, .seq = 2050, .kv_seq = 4400, .head_dim = 64},
        DType::F32,
        MaskKind::CausalBottomRight},
       20.0},
      {{"window_hdim128_fp32",
        {.heads = 1, .seq = 2200, .head_dim = 128, .window = 300},
        DType::F32,
        MaskKind::SlidingWindow},
       0.0},
      {{"none_f16", {.heads = 1, .seq = 1100, .kv_seq = 4200, .head_dim = 64}, DType::F16, MaskKind::None}, 0.0},
  };
  for (const LongCase& lc : long_cases) {
    const Case& c = lc.c;
    Problem p = testing::to_problem(c.shape, c.dtype, c.mask);
    p.softcap = lc.softcap;
    p.validate();
    ASSERT_TRUE(flash->eligibility(p).eligible) << c.name;
    EXPECT_EQ(cpu::flash::kernels_of(GetParam()).forward_block_rows(p), 128) << c.name;
    const Inputs in = make_inputs(p, 17, cpu_allocator());
    testing::expect_flash_accurate(p, flash_forward_errors(*flash, p, in, 160),
                                   std::string(cpu::isa_name(GetParam())) + " " + c.name);
  }
}

// A packed batch whose longest sequence takes the 128-row items (every
// sequence then does, the short and empty ones included), and a paged cache
// of 4400 keys read through its block table, against float64.
TEST_P(FlashIsa, LongPackedAndPagedForwardMatchFloat64) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  Problem base;
  base.heads = 2;
  base.kv_heads = 1;
  base.head_dim = 64;
  base.dtype = DType::F32;
  base.mask = MaskKind::Causal;
  Problem packed = varlen_problem(base, {4200, 130, 0, 2100}, {4200, 130, 7, 2100});
  packed.normalize();
  Problem paged = testing::to_problem(Shape{.heads = 2, .seq = 300, .kv_seq = 4400, .head_dim = 64}, DType::F32,
                                      MaskKind::CausalBottomRight);
  paged.kv_cache = KvCache::Paged;
  paged.page_size = 64;
  const auto& kernels = cpu::flash::kernels_of(GetParam());
  for (Problem& p : {std::ref(packed), std::ref(paged)}) {
    p.validate();
    const std::string what = std::string(cpu::isa_name(GetParam())) + (p.varlen() ? " packed" : " paged");
    ASSERT_TRUE(flash->eligibility(p).eligible) << what;
    EXPECT_EQ(kernels.forward_block_rows(p), 128) << what;
    const Inputs in = make_inputs(p, 29, cpu_allocator());
    testing::expect_flash_accurate(p, flash_forward_errors(*flash, p, in, 200), what);
  }
}

// Keys whose scores grow along the sequence (K row j scaled by 1 + j / 40),
// so a row's running max passes its shift by more than kMaxLead again and
// again and the accumulator is rescaled on many blocks, where random inputs
// move it on the first blocks only. fp32 and bf16, forward with its LSE.
TEST_P(FlashIsa, ForwardWithARisingMaxMatchesFloat64) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  for (const DType dtype : {DType::F32, DType::BF16}) {
    Problem p = testing::to_problem(Shape{.heads = 2, .seq = 70, .kv_seq = 1000, .head_dim = 64}, dtype,
                                    MaskKind::CausalBottomRight);
    p.validate();
    const Inputs in = make_inputs(p, 23, cpu_allocator());
    const Tensor& k = in.k;
    for (std::int64_t h = 0; h < p.kv_heads; ++h)
      for (std::int64_t j = 0; j < p.kv_seq; ++j)
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          const std::int64_t at = k.index(0, h, j, d);
          const float grow = 1.0f + static_cast<float>(j) / 40.0f;
          if (dtype == DType::F32) {
            k.data_as<float>()[at] *= grow;
          } else {
            auto* x = k.data_as<std::uint16_t>() + at;
            *x = float_to_bf16(bf16_to_float(*x) * grow);
          }
        }
    testing::expect_flash_accurate(
        p, flash_forward_errors(*flash, p, in, 1 << 20),
        std::string(cpu::isa_name(GetParam())) + " rising max " + std::string(dtype_name(dtype)));
  }
}

TEST_P(FlashIsa, BackwardMatchesFloat64) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  for (const Case& c : cases()) {
    if (c.dtype == DType::F16) continue;  // fp16 shares bf16's widened path; kept short
    Problem p = testing::to_problem(c.shape, c.dtype, c.mask);
    p.pass = Pass::Backward;
    p.validate();
    ASSERT_TRUE(flash->eligibility(p).eligible) << c.name;
    const GradientErrors e = testing::flash_backward_errors(*flash, p, 5);
    const std::string what = std::string(cpu::isa_name(GetParam())) + " " + c.name;
    testing::expect_flash_accurate(p, e.dq, what + " dQ");
    testing::expect_flash_accurate(p, e.dk, what + " dK");
    testing::expect_flash_accurate(p, e.dv, what + " dV");
  }
}

// The bf16 backward's products (VDPBF16PS, or AMX tiles at the amx level; P
// and dS rounded to bf16: the levels with bf16 products) against float64 at the 16-bit acceptance rule,
// as the forward's bf16 cases: ragged query and key blocks (odd key counts
// too), kv_seq != seq, grouped-query heads, causal and none, head dims 64
// and 128, and soft caps that bite (scale 1: scores near +-8).
TEST_P(FlashIsa, Bf16BackwardProductsMatchFloat64) {
  const auto& k = cpu::flash::kernels_of(GetParam());
  if (!k.bf16_gemm) GTEST_SKIP() << cpu::isa_name(GetParam()) << " has no bf16 products (avx512bf16 and amx do)";
  struct Bf16Case {
    const char* name;
    Shape shape;
    MaskKind mask;
    double softcap = 0;
  };
  const std::vector<Bf16Case> bf16_cases = {
      {"gqa_causal_hdim64", {.heads = 4, .kv_heads = 2, .seq = 200, .head_dim = 64}, MaskKind::Causal},
      {"gqa_none_hdim128", {.heads = 6, .kv_heads = 2, .seq = 130, .kv_seq = 301, .head_dim = 128}, MaskKind::None},
      {"causal_kv_longer_hdim128",
       {.batch = 2, .heads = 2, .seq = 150, .kv_seq = 270, .head_dim = 128},
       MaskKind::Causal},
      {"none_kv_shorter_hdim64", {.heads = 2, .seq = 190, .kv_seq = 77, .head_dim = 64}, MaskKind::None},
      {"capped_gqa_none_hdim64",
       {.heads = 4, .kv_heads = 2, .seq = 70, .kv_seq = 151, .head_dim = 64, .scale = 1.0},
       MaskKind::None,
       2.0},
      {"capped_causal_hdim128",
       {.heads = 2, .seq = 100, .kv_seq = 109, .head_dim = 128, .scale = 1.0},
       MaskKind::Causal,
       30.0},
  };
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  for (const Bf16Case& c : bf16_cases) {
    Problem p = testing::to_problem(c.shape, DType::BF16, c.mask);
    p.softcap = c.softcap;
    p.pass = Pass::Backward;
    p.validate();
    const Eligibility el = flash->eligibility(p);
    ASSERT_TRUE(el.eligible) << c.name << ": " << el.reason;
    const char* products = GetParam() == CpuIsa::Amx ? "backward bf16 AMX tile products (TDPBF16PS)"
                                                     : "backward bf16 dot products (VDPBF16PS)";
    EXPECT_NE(el.reason.find(products), std::string::npos) << el.reason;
    const GradientErrors e = testing::flash_backward_errors(*flash, p, 13);
    const std::string what = std::string(cpu::isa_name(GetParam())) + " bf16 products " + c.name;
    testing::expect_flash_accurate(p, e.dq, what + " dQ");
    testing::expect_flash_accurate(p, e.dk, what + " dK");
    testing::expect_flash_accurate(p, e.dv, what + " dV");
    std::printf("%s: rel dQ %.2e dK %.2e dV %.2e\n", what.c_str(), e.dq.rel, e.dk.rel, e.dv.rel);
  }
}

// The vector exp2 of the softmax against std::exp2 over the exponents it
// takes (<= 0); below -127 at most the smallest normal float, and exactly 0
// from -150 down (a masked score); 1 within rounding just below 0.
TEST_P(FlashIsa, VectorExp2MatchesStdExp2) {
  std::vector<float> xs;
  for (float x = 0.0f; x > -126.0f; x -= 0.173f) xs.push_back(x);
  for (const float x : {-1e-30f, -1e-9f, -5.96e-8f, -0.999999f, -1.0f, -1.000001f}) xs.push_back(x);
  const std::size_t flushed = xs.size();
  for (const float x : {-127.0f, -127.5f, -149.0f, -300.0f, -1e30f, -std::numeric_limits<float>::infinity()})
    xs.push_back(x);
  while (xs.size() % 16 != 0) xs.push_back(-std::numeric_limits<float>::infinity());
  std::vector<float> got(xs.size(), std::numeric_limits<float>::quiet_NaN());
  cpu::flash::kernels_of(GetParam()).vector_exp2(xs.data(), got.data(), static_cast<std::int64_t>(xs.size()));
  // Exactly 1 at 0: the softmax's rescale factor where the max did not move.
  EXPECT_EQ(got[0], 1.0f);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double want = std::exp2(static_cast<double>(xs[i]));
    if (i >= flushed) {
      EXPECT_LE(got[i], std::numeric_limits<float>::min()) << "exp2(" << xs[i] << ")";
      EXPECT_GE(got[i], 0.0f) << "exp2(" << xs[i] << ")";
      if (xs[i] <= -150.0f) EXPECT_EQ(got[i], 0.0f) << "exp2(" << xs[i] << ")";
    } else {
      EXPECT_LE(std::abs(got[i] - want), 1e-6 * want + 1e-38) << "exp2(" << xs[i] << ") = " << got[i];
    }
  }
}

// The bf16 product behind the bf16 ceiling (avx512bf16 and amx) against a
// float64 product of the same bf16 values.
TEST_P(FlashIsa, Bf16GemmMatchesFloat64) {
  const auto& k = cpu::flash::kernels_of(GetParam());
  if (!k.bf16_gemm) GTEST_SKIP() << cpu::isa_name(GetParam()) << " has no bf16 product (avx512bf16 and amx do)";
  const std::int64_t m = 64, n = 32, depth = 96;
  std::vector<std::uint16_t> a(static_cast<std::size_t>(m * depth));
  std::vector<float> b(static_cast<std::size_t>(depth * n));
  std::uint32_t state = 12345;
  const auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  };
  for (auto& x : a) x = float_to_bf16(next());
  for (auto& x : b) x = bf16_to_float(float_to_bf16(next()));
  std::vector<std::uint32_t> b_vnni(static_cast<std::size_t>(depth / 2 * n));
  for (std::int64_t p = 0; p < depth / 2; ++p)
    for (std::int64_t c = 0; c < n; ++c)
      b_vnni[static_cast<std::size_t>(p * n + c)] =
          float_to_bf16(b[static_cast<std::size_t>(2 * p * n + c)]) |
          (static_cast<std::uint32_t>(float_to_bf16(b[static_cast<std::size_t>((2 * p + 1) * n + c)])) << 16);
  std::vector<float> c(static_cast<std::size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
  k.bf16_gemm(a.data(), b_vnni.data(), c.data(), m, n, depth);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (std::int64_t d = 0; d < depth; ++d)
        want += static_cast<double>(bf16_to_float(a[static_cast<std::size_t>(i * depth + d)])) *
                b[static_cast<std::size_t>(d * n + j)];
      EXPECT_NEAR(c[static_cast<std::size_t>(i * n + j)], want, 1e-4) << i << ", " << j;
    }
}

INSTANTIATE_TEST_SUITE_P(Levels, FlashIsa, ::testing::ValuesIn(cpu::kAllCpuIsas),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(cpu::isa_name(info.param));
                         });

// The default (nothing forced) is the best level here, and says why.
TEST(FlashIsaChoice, DefaultIsTheBestLevelAndSaysWhy) {
  const ForceIsa force("");
  const cpu::IsaChoice c = cpu::choose_isa();
  EXPECT_TRUE(c.error.empty()) << c.error;
  EXPECT_EQ(c.isa, cpu::best_isa());
  EXPECT_EQ(c.why.rfind(std::string(cpu::isa_name(c.isa)) + " (", 0), 0u) << c.why;
  if (c.isa != CpuIsa::Amx) EXPECT_NE(c.why.find("(no "), std::string::npos) << c.why;
  EXPECT_TRUE(cpu::isa_missing(CpuIsa::Scalar).empty()) << "baseline x86-64 runs everywhere";

  auto flash = cpu::make_flash();
  Problem p = testing::to_problem(Shape{.seq = 64}, DType::F32, MaskKind::Causal);
  EXPECT_NE(flash->eligibility(p).reason.find("flash cpu kernel: " + c.why), std::string::npos)
      << flash->eligibility(p).reason;
}

TEST(FlashIsaChoice, UnknownLevelIsRefusedInOneLine) {
  const ForceIsa force("avx9000");
  const cpu::IsaChoice c = cpu::choose_isa();
  EXPECT_NE(c.error.find("ATTNPROF_CPU_ISA=avx9000 is not a CPU kernel level"), std::string::npos) << c.error;
  EXPECT_EQ(c.error.find('\n'), std::string::npos);
  auto flash = cpu::make_flash();
  Problem p = testing::to_problem(Shape{.seq = 64}, DType::F32, MaskKind::Causal);
  const Eligibility el = flash->eligibility(p);
  EXPECT_FALSE(el.eligible);
  EXPECT_EQ(el.reason, c.error);
}

// Every level this CPU lacks, forced: refused in one line naming what is
// missing, by the choice, the eligibility, the forward and backward (which
// throw before any kernel runs) and the command (exit code 1 or 2, no signal).
TEST(FlashIsaChoice, ForcingALevelThisCpuLacksIsRefusedInOneLine) {
  int refused = 0;
  for (CpuIsa isa : cpu::kAllCpuIsas) {
    const std::string missing = cpu::isa_missing(isa);
    if (missing.empty()) continue;
    ++refused;
    const std::string name(cpu::isa_name(isa));
    const ForceIsa force(name);
    const cpu::IsaChoice c = cpu::choose_isa();
    EXPECT_EQ(c.error, "ATTNPROF_CPU_ISA=" + name + " cannot run on this CPU: it lacks " + missing +
                           " (best here: " + std::string(cpu::isa_name(cpu::best_isa())) + ")");
    EXPECT_EQ(c.error.find('\n'), std::string::npos);

    auto flash = cpu::make_flash();
    Problem p = testing::to_problem(Shape{.seq = 64}, DType::BF16, MaskKind::Causal);
    const Eligibility el = flash->eligibility(p);
    EXPECT_FALSE(el.eligible) << name;
    EXPECT_EQ(el.reason, c.error);
    const Inputs in = make_inputs(p, 3, cpu_allocator());
    Tensor out = testing::nan_tensor(p, p.heads, p.seq);
    RunContext ctx{.allocator = cpu_allocator(), .threads = 1};
    try {
      flash->forward(p, in, out, ctx);
      ADD_FAILURE() << name << ": the forward ran";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
      EXPECT_EQ(std::string(e.what()), "flash: " + c.error);
    }

    // The command built beside this test, or (a build carried to another
    // machine: scripts/cpu_isa_dev.sh) where ATTNPROF_CLI names it.
    const char* cli = std::getenv("ATTNPROF_CLI") ? std::getenv("ATTNPROF_CLI") : ATTNPROF_CLI_PATH;
    const std::string cmd = "ATTNPROF_CPU_ISA=" + name + " " + cli +
                            " profile --device cpu --backend flash --seq 64 --heads 1 --dtype bf16 --mask causal "
                            "--warmup 0 --active 1 --trace-dir /tmp/attnprof_isa_test --quiet 2>&1 >/dev/null";
    FILE* pipe = ::popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string err;
    char buf[512];
    while (std::fgets(buf, sizeof buf, pipe)) err += buf;
    const int status = ::pclose(pipe);
    ASSERT_TRUE(WIFEXITED(status)) << name << ": the command died by a signal: " << err;
    EXPECT_NE(WEXITSTATUS(status), 0) << err;
    EXPECT_NE(err.find(c.error), std::string::npos) << err;
  }
  if (refused == 0) GTEST_SKIP() << "this CPU runs every level (" << cpu::isa_flags_present() << "): none to refuse";
}

}  // namespace
}  // namespace attnprof
