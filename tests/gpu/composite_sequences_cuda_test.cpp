// The composites (naive, naive_inplace, math) on CUDA with what real models
// pass (issue 22 items 2 and 3): packed (variable-length) batches, run as a
// loop over the sequences on the CUDA ops, and soft-capped scores through the
// CUDA ops' tanh and tanh_backward. Forward and training step on fresh random
// inputs, outputs and gradients NaN-poisoned before the call, against the
// float64 reference, with the same length sets and acceptance as the CPU's
// (tests/cpu/varlen_test.cpp, tests/cpu/softcap_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "attnprof/varlen.h"
#include "common/test_problem.h"
#include "common/varlen_cases.h"
#include "cuda_forward.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

using testing::expect_accurate;
using testing::run_once;

constexpr const char* kComposites[] = {"naive", "naive_inplace", "math"};

Backend& cuda_backend(const char* name) {
  Backend* b = find_backend(name, Device::Cuda);
  if (b == nullptr) ADD_FAILURE() << name << " is not registered on cuda";
  return *b;
}

// ---- Packed batches ------------------------------------------------------

using testing::PackedConfig;

const PackedConfig kPacked[] = {
    {"none_f32", MaskKind::None, 2, 2, 32, 0, DType::F32},
    {"causal_gqa_bf16", MaskKind::Causal, 4, 2, 64, 0, DType::BF16},
    {"bottom_right_mqa_f32", MaskKind::CausalBottomRight, 4, 1, 40, 0, DType::F32},
    {"window_gqa_f16", MaskKind::SlidingWindow, 4, 2, 32, 24, DType::F16},
};

class CompositePackedCuda : public ::testing::TestWithParam<PackedConfig> {};

// Every composite, one training step and one forward, on every shared length
// set (an empty and a one-row sequence, queries without keys and keys
// without queries among them).
TEST_P(CompositePackedCuda, MatchesFloat64ForwardAndBackward) {
  REQUIRE_GPU();
  const PackedConfig& c = GetParam();
  std::uint64_t seed = 220;
  for (const auto& [q, kv] : testing::length_sets()) {
    const Problem p = testing::packed_problem(c, q, kv, Device::Cuda, Pass::Train);
    ++seed;
    const Inputs in = make_inputs(p, seed, cpu_allocator());
    const Tensor dout = make_dout(p, seed, cpu_allocator());
    for (const char* name : kComposites) {
      Backend& b = cuda_backend(name);
      const Eligibility el = eligibility_of(b, p);
      ASSERT_TRUE(el.eligible) << name << ": " << el.reason;
      EXPECT_NE(el.reason.find("packed sequences run one by one"), std::string::npos) << el.reason;
      const std::string what = std::string(name) + " " + p.describe();
      // naive's NaN on fully masked rows is documented (every key masked),
      // and through P^T dO it reaches every dV row of that sequence.
      const bool nan_ok = b.traits().nan_on_fully_masked;
      const bool dv_nan = nan_ok && p.fully_masked_rows() > 0;
      const testing::CudaRun r = run_once(b, p, in, dout);
      expect_accurate(p, check_against_reference(p, in, r.out, sample_rows(p, 1 << 20)), what + " out", nan_ok);
      const GradientErrors e =
          check_gradients_against_reference(p, in, dout, r.grads, sample_rows(p, 1 << 20), sample_kv_rows(p, 1 << 20));
      expect_accurate(p, e.dq, what + " dQ", nan_ok);
      expect_accurate(p, e.dk, what + " dK");
      if (!dv_nan) expect_accurate(p, e.dv, what + " dV", nan_ok);
      Problem fwd = p;
      fwd.pass = Pass::Forward;
      const testing::CudaRun f = run_once(b, fwd, in, {});
      expect_accurate(fwd, check_against_reference(fwd, in, f.out, sample_rows(fwd, 1 << 20)), what + " forward",
                      nan_ok);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CompositePackedCuda, ::testing::ValuesIn(kPacked),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Soft caps -------------------------------------------------------------

struct CapConfig {
  const char* name;
  DType dtype;
  MaskKind mask;
  double cap;
};

const CapConfig kCaps[] = {
    {"f32_none_cap30", DType::F32, MaskKind::None, 30},       {"f32_causal_cap2", DType::F32, MaskKind::Causal, 2},
    {"bf16_causal_cap30", DType::BF16, MaskKind::Causal, 30}, {"bf16_none_cap2", DType::BF16, MaskKind::None, 2},
    {"f16_causal_cap2", DType::F16, MaskKind::Causal, 2},
};

// Scale 1 (not 1/sqrt(D)): the scores spread over about +-8, so a cap of 2
// bites hard and even 30 moves the largest ones. Grouped-query heads, more
// keys than queries.
Problem capped(const CapConfig& c, double cap, Pass pass) {
  Problem p = testing::to_problem(
      testing::Shape{.batch = 2, .heads = 4, .kv_heads = 2, .seq = 70, .kv_seq = 150, .head_dim = 64}, c.dtype, c.mask,
      Device::Cuda);
  p.scale = 1.0;
  p.softcap = cap;
  p.pass = pass;
  p.normalize();
  p.validate();
  return p;
}

// FP32 within 1e-5; 16-bit within the acceptance rule against the yardstick
// (testing::tolerated): the larger of math's error on the same capped problem
// and the backend's own without the cap (naive computes the scores, and the
// cap's three ops, in the input dtype, as PyTorch's eager Gemma-2 runs them).
bool tolerated(const Problem& p, const ErrorStats& e, double yardstick, std::string* why) {
  return testing::tolerated(p, e, yardstick, why, 1e-5);
}

class CompositeSoftcapCuda : public ::testing::TestWithParam<CapConfig> {};

TEST_P(CompositeSoftcapCuda, ForwardAndBackwardMatchTheCappedReference) {
  REQUIRE_GPU();
  const CapConfig& c = GetParam();
  const Problem p = capped(c, c.cap, Pass::Train), uncapped = capped(c, 0, Pass::Train);
  const Inputs in = make_inputs(p, 31, cpu_allocator());
  const Tensor dout = make_dout(p, 31, cpu_allocator());
  const RowSample q_rows = sample_rows(p, 1 << 20), kv_rows = sample_kv_rows(p, 1 << 20);
  const auto out_error = [&](const Problem& q, const testing::CudaRun& r) {
    return check_against_reference(q, in, r.out, q_rows);
  };
  const auto grad_errors = [&](const Problem& q, const testing::CudaRun& r) {
    return check_gradients_against_reference(q, in, dout, r.grads, q_rows, kv_rows);
  };
  const testing::CudaRun math = run_once(cuda_backend("math"), p, in, dout);
  for (const char* name : kComposites) {
    Backend& b = cuda_backend(name);
    const Eligibility el = eligibility_of(b, p);
    ASSERT_TRUE(el.eligible) << name << ": " << el.reason;
    EXPECT_NE(el.reason.find("soft cap"), std::string::npos) << el.reason;
    const testing::CudaRun r = run_once(b, p, in, dout), own = run_once(b, uncapped, in, dout);
    const GradientErrors g = grad_errors(p, r), g_math = grad_errors(p, math), g_own = grad_errors(uncapped, own);
    const std::vector<std::pair<const char*, std::pair<ErrorStats, double>>> checks = {
        {"out", {out_error(p, r), std::max(out_error(p, math).rel, out_error(uncapped, own).rel)}},
        {"dQ", {g.dq, std::max(g_math.dq.rel, g_own.dq.rel)}},
        {"dK", {g.dk, std::max(g_math.dk.rel, g_own.dk.rel)}},
        {"dV", {g.dv, std::max(g_math.dv.rel, g_own.dv.rel)}},
    };
    std::string why;
    for (const auto& [what, check] : checks) {
      EXPECT_TRUE(tolerated(p, check.first, check.second, &why)) << name << " " << c.name << " " << what << ": " << why;
    }
    // A wrong cap is caught: against half the cap the same output and dQ
    // fail the same rule (the cap's derivative is in dQ).
    const Problem half = capped(c, c.cap / 2, Pass::Train);
    const double out_yardstick = checks[0].second.second, dq_yardstick = checks[1].second.second;
    EXPECT_FALSE(tolerated(half, out_error(half, r), out_yardstick, &why)) << name << " out passed at half the cap";
    EXPECT_FALSE(tolerated(half, grad_errors(half, r).dq, dq_yardstick, &why)) << name << " dQ passed at half the cap";
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CompositeSoftcapCuda, ::testing::ValuesIn(kCaps),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace attnprof
