// flash's sm90 kernels (and, at head dim 32, its sm80 kernels) on what real
// models pass (issue 22): packed (variable-length) batches and soft-capped
// scores (a dense batch's per-sequence rows: flash_rows_test.cpp). Forward and training step on fresh random
// inputs, outputs and gradients NaN-poisoned before the call, against the
// float64 reference; the deterministic dQ on packed batches bitwise
// repeatable; and what these kernels do not take refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "attnprof/varlen.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "common/varlen_cases.h"
#include "cuda_forward.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

using testing::expect_accurate;
using testing::Lens;

bool sm90_flash() { return testing::has_gpu() && cuda::flash_sm90_runs_here(); }

#define REQUIRE_SM90_FLASH() \
  REQUIRE_GPU();             \
  if (!sm90_flash()) GTEST_SKIP() << "flash's sm90 kernels need an sm90 GPU with sm_90a code"

using FlashRun = testing::CudaRun;

FlashRun run_flash(const Problem& p, const Inputs& host, const Tensor& host_dout) {
  return testing::run_once(*find_backend("flash", Device::Cuda), p, host, host_dout);
}

// The float64 check of a run on `in`: O, and with a backward dQ, dK and dV.
void expect_run_matches_reference(const Problem& p, const Inputs& in, std::uint64_t seed) {
  const std::string what = p.describe();
  Backend& b = *find_backend("flash", Device::Cuda);
  const Eligibility el = eligibility_of(b, p);
  ASSERT_TRUE(el.eligible) << what << ": " << el.reason;
  const Tensor dout = make_dout(p, seed, cpu_allocator());
  const FlashRun r = run_flash(p, in, dout);
  expect_accurate(p, check_against_reference(p, in, r.out, sample_rows(p, 1 << 20)), what + " out");
  if (p.pass == Pass::Forward) return;
  const GradientErrors e =
      check_gradients_against_reference(p, in, dout, r.grads, sample_rows(p, 1 << 20), sample_kv_rows(p, 1 << 20));
  expect_accurate(p, e.dq, what + " dQ");
  expect_accurate(p, e.dk, what + " dK");
  expect_accurate(p, e.dv, what + " dV");
}

// The same on fresh random inputs.
void expect_matches_reference(const Problem& p, std::uint64_t seed) {
  expect_run_matches_reference(p, make_inputs(p, seed, cpu_allocator()), seed);
}

// ---- Packed batches ------------------------------------------------------

// The shared sets (tests/common/varlen_cases.h), then one sequence and
// lengths across the kernels' tile edges (64, 128), and random sets of up to
// 6 sequences of up to 400 rows.
std::vector<testing::LengthSet> length_sets() {
  return testing::length_sets({{{300}, {257}}, {{127, 128, 129, 255, 2}, {127, 128, 129, 255, 2}}},
                              {.seed = 2212, .more_sequences = 5, .max_len = 400});
}

using Config = testing::PackedConfig;

const Config kPacked[] = {
    {"none_d64_bf16", MaskKind::None, 4, 4, 64, 0, DType::BF16},
    {"causal_gqa_d128_bf16", MaskKind::Causal, 8, 2, 128, 0, DType::BF16},
    {"bottom_right_mqa_d128_fp16", MaskKind::CausalBottomRight, 4, 1, 128, 0, DType::F16},
    {"window_gqa_d64_fp16", MaskKind::SlidingWindow, 4, 2, 64, 48, DType::F16},
    {"causal_d96_bf16", MaskKind::Causal, 4, 2, 96, 0, DType::BF16},
    {"causal_d256_bf16", MaskKind::Causal, 4, 2, 256, 0, DType::BF16},
    {"none_d192_bf16", MaskKind::None, 2, 1, 192, 0, DType::BF16},
    {"causal_d128_deterministic", MaskKind::Causal, 4, 2, 128, 0, DType::BF16, true},
    {"none_d256_deterministic", MaskKind::None, 2, 2, 256, 0, DType::BF16, true},
};

Problem packed(const Config& c, const Lens& q, const Lens& kv, Pass pass) {
  return testing::packed_problem(c, q, kv, Device::Cuda, pass);
}

class FlashPacked : public ::testing::TestWithParam<Config> {};

TEST_P(FlashPacked, MatchesFloat64ForwardAndBackward) {
  REQUIRE_GPU();
  if (GetParam().head_dim != 32 && !sm90_flash()) GTEST_SKIP() << "flash's sm90 kernels need an sm90 GPU";
  std::uint64_t seed = GetParam().head_dim == 32 ? 140 : 40;
  for (const auto& [q, kv] : length_sets()) {
    expect_matches_reference(packed(GetParam(), q, kv, Pass::Train), ++seed);
    expect_matches_reference(packed(GetParam(), q, kv, Pass::Forward), ++seed);
  }
}

INSTANTIATE_TEST_SUITE_P(Sm90, FlashPacked, ::testing::ValuesIn(kPacked),
                         [](const auto& info) { return std::string(info.param.name); });

// flash's sm80 kernels (FlashAttention-2 class, Ampere's path) on packed
// batches: head dim 32, which only they are built for, runs them on any GPU.
const Config kPackedSm80[] = {
    {"causal_gqa_d32_bf16", MaskKind::Causal, 8, 2, 32, 0, DType::BF16},
    {"none_d32_fp16", MaskKind::None, 4, 4, 32, 0, DType::F16},
    {"bottom_right_mqa_d32_bf16", MaskKind::CausalBottomRight, 4, 1, 32, 0, DType::BF16},
    {"window_gqa_d32_fp16", MaskKind::SlidingWindow, 4, 2, 32, 48, DType::F16},
    {"causal_d32_deterministic", MaskKind::Causal, 4, 2, 32, 0, DType::BF16, true},
};

INSTANTIATE_TEST_SUITE_P(Sm80, FlashPacked, ::testing::ValuesIn(kPackedSm80),
                         [](const auto& info) { return std::string(info.param.name); });

// A sequence of a packed batch gives what the same sequence gives alone:
// tiles never read across into a neighbour (the neighbours here are NaN-free
// but different, so a leak shows as a difference).
TEST(FlashPackedChecks, EachSequenceAsItsDenseCallBitForBit) {
  REQUIRE_SM90_FLASH();
  const Config c{"causal", MaskKind::Causal, 4, 2, 128, 0, DType::BF16};
  // (Each longer than the decode kernel's queries, so the dense calls take the same kernel.)
  const Problem p = packed(c, {100, 300, 40}, {100, 300, 40}, Pass::Forward);
  const Inputs in = make_inputs(p, 9, cpu_allocator());
  const FlashRun whole = run_flash(p, in, {});
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem one = p.sequence(b);
    const Inputs alone = sequence_inputs(p, in, b);
    const FlashRun r = run_flash(one, alone, {});
    const Tensor rows = sequence_q_rows(p, whole.out, b);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < one.seq; ++i) {
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          ASSERT_EQ(rows.get(0, h, i, d), r.out.get(0, h, i, d)) << "sequence " << b << " head " << h << " row " << i;
        }
      }
    }
  }
}

TEST(FlashPackedChecks, DeterministicBackwardIsBitwiseRepeatable) {
  REQUIRE_SM90_FLASH();
  const Config c{"det", MaskKind::Causal, 8, 2, 128, 0, DType::BF16, true};
  const Problem p = packed(c, {700, 3, 513}, {700, 3, 513}, Pass::Train);
  const Inputs in = make_inputs(p, 5, cpu_allocator());
  const Tensor dout = make_dout(p, 5, cpu_allocator());
  const FlashRun a = run_flash(p, in, dout), b = run_flash(p, in, dout);
  ASSERT_EQ(a.grads.dq.nbytes(), b.grads.dq.nbytes());
  EXPECT_EQ(std::memcmp(a.grads.dq.data(), b.grads.dq.data(), a.grads.dq.nbytes()), 0);
}

// The backward's workspace rows past a short sequence's last query tile are
// neither zeroed nor read: a dense backward of the same workspace size (the
// caching allocator hands its block back) leaves sums of its own there, and
// the packed backward after it still matches float64, on sm90 (128) and sm80 (32).
TEST(FlashPackedChecks, BackwardAfterADenseOneReadsNoStaleWorkspace) {
  REQUIRE_GPU();
  for (const std::int64_t d : {32, 128}) {
    if (d != 32 && !sm90_flash()) continue;
    for (const bool deterministic : {false, true}) {
      const Config c{"stale", MaskKind::Causal, 4, 2, d, 0, DType::BF16, deterministic};
      const Problem p = packed(c, {700, 3, 130}, {700, 3, 130}, Pass::Train);
      Problem dense = p;
      dense.seq_lens.clear();
      dense.kv_seq_lens.clear();
      dense.seq = dense.kv_seq = 700;
      ASSERT_EQ(dense.batch, 3);
      const Tensor dense_dout = make_dout(dense, 3, cpu_allocator());
      run_flash(dense, make_inputs(dense, 3, cpu_allocator()), dense_dout);
      expect_matches_reference(p, 4 + d);
    }
  }
}

// ---- Key padding ---------------------------------------------------------

Problem padded(std::int64_t batch, std::int64_t seq, std::int64_t kv_seq, std::int64_t head_dim, DType dtype,
               Pass pass) {
  Problem p{.batch = batch,
            .heads = 4,
            .kv_heads = 2,
            .seq = seq,
            .kv_seq = kv_seq,
            .head_dim = head_dim,
            .dtype = dtype,
            .device = Device::Cuda,
            .mask = MaskKind::Boolean};
  p.pass = pass;
  p.normalize();
  p.validate();
  return p;
}

// Key padding on CUDA is given as per-sequence rows (Inputs::kv_rows,
// q_rows), never as a mask tensor read back: flash_rows_test.cpp.

// ---- Soft-capping --------------------------------------------------------

// Scale 2 makes scores of a few units, so that a cap of 2 bends them; the
// default scale (|s scale| about 1) with caps of 30 and 4 keeps them where
// real models' caps see them, from far inside the cap to within a few units.
TEST(FlashSoftcap, MatchesFloat64ForwardAndBackward) {
  REQUIRE_SM90_FLASH();
  std::uint64_t seed = 90;
  for (const std::int64_t d : {64, 96, 128, 256}) {
    for (const MaskKind mask : {MaskKind::None, MaskKind::Causal, MaskKind::SlidingWindow}) {
      for (const auto [cap, scale] :
           {std::pair{30.0, 2.0}, std::pair{2.0, 2.0}, std::pair{30.0, 0.0}, std::pair{4.0, 0.0}}) {
        for (const Pass pass : {Pass::Forward, Pass::Train}) {
          Problem p{.batch = 2,
                    .heads = 4,
                    .kv_heads = 2,
                    .seq = 200,
                    .kv_seq = 230,
                    .head_dim = d,
                    .dtype = d == 96 ? DType::F16 : DType::BF16,
                    .device = Device::Cuda,
                    .mask = mask == MaskKind::Causal ? MaskKind::CausalBottomRight : mask,
                    .window = mask == MaskKind::SlidingWindow ? 64 : 0};
          // 0: the default, 1 / sqrt(d).
          if (scale > 0) p.scale = scale;
          p.softcap = cap;
          p.pass = pass;
          p.normalize();
          p.validate();
          expect_matches_reference(p, ++seed);
        }
      }
    }
  }
}

// bf16's capped forward takes its exponentials against a fixed base while
// cap log2 e <= 80 (OnlineSoftmax::scores_fixed_base), a running max past it.
// Both sides of that bound, on rows at the ends of the range it relies on:
// keys of positive entries and query rows alternately of positive and of
// negative ones, so that each row's scores all sit near +cap or all near
// -cap (every p near 2^-72 at a cap of 50); V times 2^12; rows that see no
// key (bottom-right, more queries than keys). Forward and gradients against
// float64.
TEST(FlashSoftcap, SaturatedRowsMatchFloat64OnEitherSideOfTheFixedBase) {
  REQUIRE_SM90_FLASH();
  std::uint64_t seed = 300;
  for (const double cap : {50.0, 55.0, 60.0}) {  // cap log2 e: 72.1, 79.3 (fixed base), 86.6 (running max)
    for (const MaskKind mask : {MaskKind::None, MaskKind::CausalBottomRight}) {
      Problem p{.batch = 1,
                .heads = 4,
                .kv_heads = 2,
                .seq = 230,
                .kv_seq = 200,
                .head_dim = 128,
                .dtype = DType::BF16,
                .device = Device::Cuda,
                .mask = mask};
      p.scale = 4.0;  // |scores| of a few hundred: tanh at 0.99 and past
      p.softcap = cap;
      p.pass = Pass::Train;
      p.normalize();
      p.validate();
      Inputs in = make_inputs(p, ++seed, cpu_allocator());
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t r = 0; r < p.seq; ++r) {
          for (std::int64_t c = 0; c < p.head_dim; ++c) {
            in.q.set(0, h, r, c, (r % 2 == 0 ? 1.f : -1.f) * std::fabs(in.q.get(0, h, r, c)));
          }
        }
      }
      for (std::int64_t h = 0; h < p.kv_heads; ++h) {
        for (std::int64_t r = 0; r < p.kv_seq; ++r) {
          for (std::int64_t c = 0; c < p.head_dim; ++c) {
            in.k.set(0, h, r, c, std::fabs(in.k.get(0, h, r, c)));
            in.v.set(0, h, r, c, 4096.f * in.v.get(0, h, r, c));
          }
        }
      }
      expect_run_matches_reference(p, in, seed);
    }
  }
}

// A causal row that sees one key is that key's V, bit for bit, against the
// running max (no cap, or one past the fixed base's bound) and against the
// fixed base (cap 30: its row sums come from the tensor cores, adding p as
// P V reads it), at every head dim.
TEST(FlashSoftcap, ARowOfOneKeyIsItsValue) {
  REQUIRE_SM90_FLASH();
  for (const std::int64_t d : {64, 128, 256}) {
    for (const double cap : {0.0, 30.0, 60.0}) {
      Problem p{.batch = 1, .heads = 2, .seq = 200, .head_dim = d, .device = Device::Cuda, .mask = MaskKind::Causal};
      p.softcap = cap;
      p.pass = Pass::Forward;
      p.normalize();
      p.validate();
      const Inputs in = make_inputs(p, 40 + static_cast<std::uint64_t>(d), cpu_allocator());
      const FlashRun r = run_flash(p, in, {});
      int differ = 0;
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t c = 0; c < d; ++c) differ += r.out.get(0, h, 0, c) != in.v.get(0, h, 0, c);
      }
      EXPECT_EQ(differ, 0) << p.describe() << ": row 0 differs from V's key 0 in " << differ;
    }
  }
}

// The cap is really applied: without it the same inputs are far off.
TEST(FlashSoftcap, AWrongCapIsCaught) {
  REQUIRE_SM90_FLASH();
  Problem p{.batch = 1, .heads = 2, .seq = 128, .head_dim = 128, .device = Device::Cuda, .mask = MaskKind::None};
  p.scale = 2.0;
  p.softcap = 2.0;
  p.pass = Pass::Forward;
  p.normalize();
  const Inputs in = make_inputs(p, 4, cpu_allocator());
  Problem uncapped = p;
  uncapped.softcap = 0;
  const FlashRun r = run_flash(uncapped, in, {});
  const Acceptance a =
      accept(p.dtype, check_against_reference(p, in, r.out, sample_rows(p, 1 << 20)), std::nullopt, false);
  EXPECT_FALSE(a.pass) << "an uncapped run passed the capped reference";
}

// ---- What these kernels do not take --------------------------------------

TEST(FlashSequencesChecks, OtherCudaFusedBackendsRefuseByName) {
  REQUIRE_GPU();
  const Problem p = packed(kPacked[1], {40, 7}, {40, 7}, Pass::Forward);
  Backend& efficient = *find_backend("efficient", Device::Cuda);
  const Eligibility el = eligibility_of(efficient, p);
  EXPECT_FALSE(el.eligible);
  EXPECT_NE(el.reason.find("efficient"), std::string::npos) << el.reason;
  EXPECT_EQ(el.reason.find('\n'), std::string::npos) << el.reason;
  Problem capped = padded(1, 64, 64, 64, DType::BF16, Pass::Forward);
  capped.mask = MaskKind::None;
  capped.softcap = 5;
  EXPECT_FALSE(eligibility_of(efficient, capped).eligible);
  if (sm90_flash()) {
    Problem d32 = capped;
    d32.head_dim = 32;  // sm80's kernel only
    const Eligibility e = eligibility_of(*find_backend("flash", Device::Cuda), d32);
    EXPECT_FALSE(e.eligible);
    EXPECT_NE(e.reason.find("sm90 kernels only"), std::string::npos) << e.reason;
  }
}

TEST(FlashSequencesChecks, ExplainNamesWhatRuns) {
  REQUIRE_SM90_FLASH();
  const Problem p = packed(kPacked[1], {40, 7, 300}, {40, 7, 300}, Pass::Train);
  const Eligibility el = eligibility_of(*find_backend("flash", Device::Cuda), p);
  ASSERT_TRUE(el.eligible) << el.reason;
  EXPECT_NE(el.reason.find("packed batch of 3 sequences"), std::string::npos) << el.reason;
  Problem capped = padded(1, 64, 64, 128, DType::BF16, Pass::Forward);
  capped.mask = MaskKind::None;
  capped.softcap = 5;
  const Eligibility ec = eligibility_of(*find_backend("flash", Device::Cuda), capped);
  ASSERT_TRUE(ec.eligible) << ec.reason;
  EXPECT_NE(ec.reason.find("soft-capped"), std::string::npos) << ec.reason;
  // Which softmax the capped forward takes: the fixed base (bf16, c log2 e <= 80), else the running max.
  EXPECT_NE(ec.reason.find("against the fixed base c log2 e = 7.2 "), std::string::npos) << ec.reason;
  capped.softcap = 60;  // c log2 e = 86.6
  const std::string past = eligibility_of(*find_backend("flash", Device::Cuda), capped).reason;
  EXPECT_NE(
      past.find("against the running max, as without a cap (c log2 e = 86.6 is past the fixed base's bound of 80)"),
      std::string::npos)
      << past;
  capped.softcap = 5;
  capped.dtype = DType::F16;
  const std::string fp16 = eligibility_of(*find_backend("flash", Device::Cuda), capped).reason;
  EXPECT_NE(fp16.find("against the running max, as without a cap (fp16's P cannot hold the fixed base's range)"),
            std::string::npos)
      << fp16;
}

}  // namespace
}  // namespace attnprof
