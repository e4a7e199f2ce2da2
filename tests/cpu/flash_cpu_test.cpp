// The CPU flash backend against a float64 reference computed here, on random
// inputs (never zeros) and an output poisoned with NaN, so a row the kernel
// forgets to write fails loudly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "backends/cpu/cpu_backends.h"
#include "common/test_problem.h"
#include "mask_oracle.h"

namespace attnprof {
namespace {

struct Case {
  std::int64_t batch = 2, heads = 4, kv_heads = 4, seq = 130, kv_seq = 333, head_dim = 64;
  DType dtype = DType::F32;
  MaskKind mask = MaskKind::None;
  std::int64_t window = 70;
  std::optional<double> scale{};
  bool bshd = false;          // q, k, v, out as [B, S, H, D] buffers viewed through transpose(1, 2)
  bool strided_last = false;  // q, k, v with last-dim stride 2
  DType bias_dtype = DType::F32;
};

Problem problem_of(const Case& c) { return testing::to_problem(c, c.dtype, c.mask); }

// A [B, H, S, D] view in the layout the case asks for.
Tensor make_bhsd(const Case& c, std::int64_t heads, std::int64_t seq, DType dtype) {
  const std::int64_t B = c.batch, D = c.head_dim;
  if (c.bshd) return Tensor::empty({B, seq, heads, D}, dtype, cpu_allocator()).transpose(1, 2);
  if (c.strided_last) {
    Tensor wide = Tensor::empty({B, heads, seq, 2 * D}, dtype, cpu_allocator());
    return wide.as_strided({B, heads, seq, D}, {heads * seq * 2 * D, seq * 2 * D, 2 * D, 2}, 1);
  }
  return Tensor::empty({B, heads, seq, D}, dtype, cpu_allocator());
}

void fill_random(const Tensor& t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  testing::for_each_index(t, [&](auto a, auto b, auto c, auto d) {
    float x = u(rng);
    if (std::abs(x) < 1e-3f) x = 0.5f;  // never zeros
    t.set(a, b, c, d, x);
  });
}

struct Fixture {
  Problem p;
  Inputs in{};
  Tensor out{};
};

Fixture make_setup(const Case& c, std::uint32_t seed = 1) {
  Fixture s{.p = problem_of(c)};
  const Problem& p = s.p;
  std::mt19937 rng(seed);
  s.in.q = make_bhsd(c, p.heads, p.seq, p.dtype);
  s.in.k = make_bhsd(c, p.kv_heads, p.kv_seq, p.dtype);
  s.in.v = make_bhsd(c, p.kv_heads, p.kv_seq, p.dtype);
  for (const Tensor* t : {&s.in.q, &s.in.k, &s.in.v}) fill_random(*t, rng);
  if (p.mask == MaskKind::Boolean) {
    // One mask for every batch, expanded with stride 0: broadcasting must work.
    Tensor m = Tensor::empty({1, p.heads, p.seq, p.kv_seq}, DType::Bool, cpu_allocator());
    std::bernoulli_distribution keep(0.7);
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq; ++i)
        for (std::int64_t j = 0; j < p.kv_seq; ++j) m.set(0, h, i, j, (keep(rng) && i != 3) ? 1.0f : 0.0f);
    s.in.mask = m.expand({p.batch, p.heads, p.seq, p.kv_seq});
  }
  if (p.mask == MaskKind::Bias) {
    Tensor bias = Tensor::empty({p.batch, 1, p.seq, p.kv_seq}, c.bias_dtype, cpu_allocator());
    fill_random(bias, rng);
    s.in.bias = bias.expand({p.batch, p.heads, p.seq, p.kv_seq});
  }
  s.out = c.bshd ? Tensor::empty({p.batch, p.seq, p.heads, p.head_dim}, p.dtype, cpu_allocator()).transpose(1, 2)
                 : Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, cpu_allocator());
  return s;
}

void poison(const Tensor& out) {
  testing::for_each_index(
      out, [&](auto a, auto b, auto c, auto d) { out.set(a, b, c, d, std::numeric_limits<float>::quiet_NaN()); });
}

using testing::expected_visible;

// t as a dense float64 [B, H, S, D] array, so the reference loops stay cheap.
std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> r;
  r.reserve(static_cast<std::size_t>(t.numel()));
  testing::for_each_index(t, [&](auto a, auto b, auto c, auto d) { r.push_back(t.get(a, b, c, d)); });
  return r;
}

// softmax(scale q k^T + mask) v in float64, zeros for a fully masked row.
std::vector<double> reference(const Problem& p, const Inputs& in) {
  const std::int64_t B = p.batch, H = p.heads, Hk = p.kv_heads, S = p.seq, T = p.kv_seq, D = p.head_dim;
  const double scale = p.scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const std::vector<double> q = to_doubles(in.q), k = to_doubles(in.k), v = to_doubles(in.v);
  std::vector<double> out(static_cast<std::size_t>(B * H * S * D), 0.0);
  std::vector<double> s(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t hk = h / (H / Hk);
      const double* kh = &k[static_cast<std::size_t>((b * Hk + hk) * T * D)];
      const double* vh = &v[static_cast<std::size_t>((b * Hk + hk) * T * D)];
      for (std::int64_t i = 0; i < S; ++i) {
        const double* qi = &q[static_cast<std::size_t>(((b * H + h) * S + i) * D)];
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < T; ++j) {
          double x = -std::numeric_limits<double>::infinity();
          const bool keep = p.mask == MaskKind::Boolean ? in.mask.get(b, h, i, j) != 0.0f : expected_visible(p, i, j);
          if (keep) {
            double dot = 0;
            for (std::int64_t d = 0; d < D; ++d) dot += qi[d] * kh[j * D + d];
            x = scale * dot;
            if (p.mask == MaskKind::Bias) x += in.bias.get(b, h, i, j);
          }
          s[static_cast<std::size_t>(j)] = x;
          mx = std::max(mx, x);
        }
        if (std::isinf(mx)) continue;  // every key masked: zeros
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        double* o = &out[static_cast<std::size_t>(((b * H + h) * S + i) * D)];
        for (std::int64_t j = 0; j < T; ++j)
          for (std::int64_t d = 0; d < D; ++d) o[d] += s[static_cast<std::size_t>(j)] / sum * vh[j * D + d];
      }
    }
  return out;
}

// Absolute tolerance for outputs of magnitude < 1: FP32 far under 1e-4; 16-bit
// types a few units of their output rounding (2^-11 fp16, 2^-8 bf16).
double tolerance(DType t) {
  switch (t) {
    case DType::F16:
      return 2e-3;
    case DType::BF16:
      return 1.6e-2;
    default:
      return 2e-6;
  }
}

Tensor run_flash(Fixture& s, int threads) {
  auto flash = cpu::make_flash();
  poison(s.out);
  RunContext ctx{.allocator = cpu_allocator(), .threads = threads};
  flash->forward(s.p, s.in, s.out, ctx);
  return s.out;
}

void expect_matches_reference(const Case& c) {
  Fixture s = make_setup(c);
  run_flash(s, 0);
  const std::vector<double> ref = reference(s.p, s.in);
  const Problem& p = s.p;
  const double tol = tolerance(p.dtype);
  double worst = 0;
  std::int64_t bad = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq; ++i)
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          const double want = ref[static_cast<std::size_t>(((b * p.heads + h) * p.seq + i) * p.head_dim + d)];
          const double got = s.out.get(b, h, i, d);
          const double err = std::isfinite(got) ? std::abs(got - want) : std::numeric_limits<double>::infinity();
          worst = std::max(worst, err);
          if (err > tol && bad++ < 3)
            ADD_FAILURE() << "out[" << b << "," << h << "," << i << "," << d << "] = " << got << ", reference " << want;
        }
  EXPECT_EQ(bad, 0) << p.describe() << ": worst error " << worst << " > " << tol;
}

class FlashMasks : public ::testing::TestWithParam<std::tuple<MaskKind, DType>> {};

TEST_P(FlashMasks, MatchesFloat64Reference) {
  const auto [mask, dtype] = GetParam();
  expect_matches_reference({.dtype = dtype, .mask = mask});
}

INSTANTIATE_TEST_SUITE_P(AllMasksAllDtypes, FlashMasks,
                         ::testing::Combine(::testing::Values(MaskKind::None, MaskKind::Causal,
                                                              MaskKind::CausalBottomRight, MaskKind::SlidingWindow,
                                                              MaskKind::Boolean, MaskKind::Bias),
                                            ::testing::Values(DType::F32, DType::F16, DType::BF16)),
                         [](const auto& info) {
                           std::string name(mask_name(std::get<0>(info.param)));
                           std::erase(name, '-');
                           return name + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(FlashCpu, HeadDims) {
  for (std::int64_t d : {128, 40, 13})
    for (DType t : {DType::F32, DType::BF16})
      expect_matches_reference({.seq = 70, .kv_seq = 150, .head_dim = d, .dtype = t, .mask = MaskKind::Causal});
  expect_matches_reference({.batch = 1,
                            .heads = 2,
                            .kv_heads = 2,
                            .seq = 40,
                            .kv_seq = 90,
                            .head_dim = 256,
                            .mask = MaskKind::CausalBottomRight});
}

TEST(FlashCpu, GroupedAndMultiQuery) {
  expect_matches_reference({.heads = 8, .kv_heads = 2, .mask = MaskKind::Causal});
  expect_matches_reference({.heads = 8, .kv_heads = 1, .dtype = DType::F16, .mask = MaskKind::SlidingWindow});
  expect_matches_reference({.heads = 6, .kv_heads = 3, .dtype = DType::BF16, .mask = MaskKind::Boolean});
}

TEST(FlashCpu, KvSeqNotMultipleOfBlock) {
  expect_matches_reference({.seq = 65, .kv_seq = 129, .mask = MaskKind::None});
  expect_matches_reference({.seq = 200, .kv_seq = 257, .mask = MaskKind::CausalBottomRight});
  expect_matches_reference({.seq = 1, .kv_seq = 300, .mask = MaskKind::Causal});
  expect_matches_reference({.seq = 300, .kv_seq = 7, .mask = MaskKind::None});
}

TEST(FlashCpu, StridedLayouts) {
  expect_matches_reference({.mask = MaskKind::Causal, .bshd = true});
  expect_matches_reference({.dtype = DType::F16, .mask = MaskKind::CausalBottomRight, .bshd = true});
  expect_matches_reference({.heads = 4, .kv_heads = 2, .mask = MaskKind::Bias, .bshd = true});
  expect_matches_reference({.mask = MaskKind::Causal, .strided_last = true});
  expect_matches_reference({.dtype = DType::BF16, .mask = MaskKind::None, .strided_last = true});
}

TEST(FlashCpu, CustomScaleAndHalfBias) {
  expect_matches_reference({.mask = MaskKind::Causal, .scale = 0.3});
  expect_matches_reference({.mask = MaskKind::Bias, .bias_dtype = DType::F16});
  expect_matches_reference({.dtype = DType::BF16, .mask = MaskKind::Bias, .bias_dtype = DType::BF16});
}

// Bottom-right causal with kv_seq < seq: query i sees keys j <= i - (seq - kv_seq),
// so the first seq - kv_seq rows see nothing and must be zeros, not NaN.
TEST(FlashCpu, FullyMaskedRowsAreZeros) {
  for (DType t : {DType::F32, DType::BF16}) {
    Fixture s = make_setup({.seq = 150, .kv_seq = 60, .dtype = t, .mask = MaskKind::CausalBottomRight});
    run_flash(s, 0);
    for (std::int64_t b = 0; b < s.p.batch; ++b)
      for (std::int64_t h = 0; h < s.p.heads; ++h)
        for (std::int64_t i = 0; i < s.p.seq; ++i)
          for (std::int64_t d = 0; d < s.p.head_dim; ++d) {
            const float x = s.out.get(b, h, i, d);
            ASSERT_FALSE(std::isnan(x)) << "row " << i;
            if (i < s.p.seq - s.p.kv_seq) {
              ASSERT_EQ(x, 0.0f) << "row " << i;
            }
          }
    expect_matches_reference({.seq = 150, .kv_seq = 60, .dtype = t, .mask = MaskKind::CausalBottomRight});
  }
  // The boolean mask of make_setup hides every key of query row 3.
  expect_matches_reference({.mask = MaskKind::Boolean});
}

TEST(FlashCpu, ThreadCountDoesNotChangeResults) {
  for (MaskKind m : {MaskKind::Causal, MaskKind::Bias}) {
    const Case c{.seq = 300, .kv_seq = 300, .mask = m};
    Fixture one = make_setup(c, 5);
    Fixture two = make_setup(c, 5);
    run_flash(one, 1);
    run_flash(two, 2);
    ASSERT_EQ(one.out.nbytes(), two.out.nbytes());
    EXPECT_EQ(std::memcmp(one.out.data(), two.out.data(), one.out.nbytes()), 0);
  }
}

TEST(FlashCpu, WorkspaceIsPerThreadAndIndependentOfSeq) {
  auto flash = cpu::make_flash();
  const Problem small = problem_of({.seq = 1024, .kv_seq = 1024, .mask = MaskKind::Causal});
  const Problem large = problem_of({.seq = 8192, .kv_seq = 8192, .mask = MaskKind::Causal});
  EXPECT_EQ(flash->workspace_bytes(small), flash->workspace_bytes(large));

  Fixture s =
      make_setup({.batch = 1, .heads = 2, .kv_heads = 2, .seq = 2048, .kv_seq = 2048, .mask = MaskKind::Causal});
  Allocator& a = cpu_allocator();
  a.reset_peak();
  const std::int64_t before = a.stats().allocated;
  run_flash(s, 0);
  const std::int64_t extra = a.stats().peak_allocated - before;
  EXPECT_LE(extra, static_cast<std::int64_t>(flash->workspace_bytes(s.p)));
  EXPECT_LT(extra, s.p.seq * s.p.kv_seq * 4) << "flash must not allocate an [S, Skv] score matrix";
}

TEST(FlashCpu, EligibilityAndExpectation) {
  auto flash = cpu::make_flash();
  EXPECT_EQ(flash->name(), "flash");
  EXPECT_EQ(flash->device(), Device::Cpu);
  const Problem p = problem_of({.mask = MaskKind::SlidingWindow});
  const Eligibility e = flash->eligibility(p);
  EXPECT_TRUE(e.eligible) << e.reason;
  EXPECT_NE(e.reason.find("tiled online softmax"), std::string::npos) << e.reason;
  EXPECT_NE(e.reason.find("never materialises [S, Skv]"), std::string::npos) << e.reason;
  const Expectation x = flash->expectation(p);
  EXPECT_EQ(x.cpu_ops, std::vector<std::string>{"flash_attention"});
  EXPECT_EQ(x.copies, 0);
  Problem gpu = p;
  gpu.device = Device::Cuda;
  EXPECT_FALSE(flash->eligibility(gpu).eligible);
}

}  // namespace
}  // namespace attnprof
