// The composites' backward (composite_backend.h): autograd's ops on their
// forward's decomposition, written once over Ops. Here on the CPU Ops, dQ, dK
// and dV against the float64 gradient reference for every mask kind, grouped
// queries and head dims up to 256; math's zero gradients on fully masked rows;
// the plan-derived expectation and workspace of a backward and a training
// step; and the runner end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/composite/composite.h"
#include "backends/composite/composite_backend.h"
#include "backends/composite/plan.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using OpNames = std::vector<std::string>;
using testing::Shape;
using testing::to_problem;

const char* const kNames[] = {"naive", "naive_inplace", "math"};
const char* const kGrads[] = {"dq", "dk", "dv"};
constexpr ErrorStats GradientErrors::*kStats[] = {&GradientErrors::dq, &GradientErrors::dk, &GradientErrors::dv};

Backend& cpu_backend(const std::string& name) {
  Backend* b = find_backend(name, Device::Cpu);
  if (b == nullptr) throw std::runtime_error("no CPU backend " + name);
  return *b;
}

struct Step {
  Inputs in;
  Tensor dout;
  Saved saved;
  Gradients grads;
};

// forward_train then backward on the CPU, into poisoned gradients (NaN), so a
// gradient element the backward does not write is seen. `bshd` lays the
// inputs and the gradients out [B, S, H, D] (strided [B, H, S, D] views).
Step train_step(Backend& b, const Problem& p, bool bshd = false) {
  Allocator& a = cpu_allocator();
  Step r;
  r.in = make_inputs(p, 3, a, bshd);
  r.dout = make_dout(p, 3, a);
  const auto poisoned = [&](const Tensor& like) {
    const Dims n = like.sizes();
    Tensor t = Tensor::empty(bshd ? Dims{n[0], n[2], n[1], n[3]} : n, p.dtype, a);
    for (std::int64_t i = 0; i < t.numel(); ++i) store_from_float(t.data(), p.dtype, i, NAN);
    return bshd ? t.transpose(1, 2) : t;
  };
  r.grads = {poisoned(r.in.q), poisoned(r.in.k), poisoned(r.in.v)};
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, a);
  RunContext ctx{a, nullptr, 0};
  b.forward_train(p, r.in, out, r.saved, ctx);
  b.backward(p, r.in, out, r.dout, r.saved, r.grads, ctx);
  return r;
}

GradientErrors errors(const Problem& p, const Step& r) {
  return check_gradients_against_reference(p, r.in, r.dout, r.grads, sample_rows(p, 1 << 20),
                                           sample_kv_rows(p, 1 << 20));
}

struct Case {
  const char* name;
  Shape shape;
  MaskKind mask;
  bool bshd = false;
};

const Case kCases[] = {
    {"causal", {.batch = 2, .heads = 2, .seq = 64, .head_dim = 64}, MaskKind::Causal},
    {"causal_bottom_right",
     {.batch = 1, .heads = 2, .seq = 48, .kv_seq = 80, .head_dim = 32},
     MaskKind::CausalBottomRight},
    {"sliding_window",
     {.batch = 1, .heads = 2, .seq = 64, .kv_seq = 96, .head_dim = 32, .window = 16},
     MaskKind::SlidingWindow},
    {"none", {.batch = 2, .heads = 1, .seq = 40, .kv_seq = 56, .head_dim = 48}, MaskKind::None},
    {"grouped_query", {.batch = 1, .heads = 4, .kv_heads = 2, .seq = 48, .head_dim = 32}, MaskKind::Causal},
    {"multi_query", {.batch = 2, .heads = 3, .kv_heads = 1, .seq = 32, .kv_seq = 40, .head_dim = 16}, MaskKind::None},
    {"head_dim_256", {.batch = 1, .heads = 2, .seq = 32, .head_dim = 256}, MaskKind::Causal},
    {"boolean", {.batch = 1, .heads = 2, .seq = 48, .head_dim = 32}, MaskKind::Boolean},
    {"bias", {.batch = 1, .heads = 2, .seq = 48, .kv_seq = 64, .head_dim = 32}, MaskKind::Bias},
    {"bshd_grouped", {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 32, .head_dim = 32}, MaskKind::Causal, true},
};

class CompositeBackward : public ::testing::TestWithParam<Case> {};

// DESIGN.md's rule, accept(): FP32 far under 1e-4 (its 2e-5 bound); 16-bit
// math within twice the dtype's floor, naive within twice math's error on the
// same problem plus the floor.
TEST_P(CompositeBackward, GradientsMatchFloat64) {
  const Case& c = GetParam();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const Problem p = to_problem(c.shape, dt, c.mask);
    ASSERT_EQ(p.fully_masked_rows(), 0) << c.name;
    std::optional<GradientErrors> math;
    for (const std::string name : {"math", "naive", "naive_inplace"}) {
      const std::string what = name + " " + p.describe();
      const GradientErrors e = errors(p, train_step(cpu_backend(name), p, c.bshd));
      for (int g = 0; g < 3; ++g) {
        const ErrorStats& s = e.*kStats[g];
        const char* grad = kGrads[g];
        EXPECT_EQ(s.nan_rows, 0) << what << " " << grad;
        EXPECT_GT(s.rows_checked, 0) << what << " " << grad;
        std::optional<double> math_rel;
        if (math && dt != DType::F32) math_rel = ((*math).*kStats[g]).rel;
        const Acceptance a = accept(dt, s, math_rel, false);
        EXPECT_TRUE(a.pass) << what << " " << grad << ": " << a.why;
        if (dt == DType::F32) EXPECT_LT(s.rel, 1e-5) << what << " " << grad;
      }
      if (!math) math = e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, CompositeBackward, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// The check is not vacuous: a gradient off by a little in one element fails.
TEST(CompositeBackwardCheck, ASmallErrorFailsTheFp32Bound) {
  const Problem p = to_problem(kCases[0].shape, DType::F32, MaskKind::Causal);
  Step r = train_step(cpu_backend("math"), p);
  r.grads.dk.data_as<float>()[r.grads.dk.numel() / 3] += 1e-2f;
  const GradientErrors e = errors(p, r);
  EXPECT_FALSE(accept(DType::F32, e.dk, std::nullopt, false).pass) << e.dk.rel;
  EXPECT_TRUE(accept(DType::F32, e.dq, std::nullopt, false).pass) << e.dq.rel;
}

// Bottom-right causal with fewer keys than queries masks the first rows fully.
Problem fully_masked_problem(DType dt) {
  Problem p = to_problem(Shape{.batch = 1, .heads = 2, .seq = 48, .kv_seq = 32, .head_dim = 32}, dt,
                         MaskKind::CausalBottomRight);
  return p;
}

// math's NaN-safe softmax saves zero probabilities on a fully masked row, so
// its backward gives zero gradients there, and no NaN anywhere.
TEST(CompositeBackward, MathGivesZeroGradientsOnFullyMaskedRows) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Problem p = fully_masked_problem(dt);
    const std::int64_t masked = p.seq - p.kv_seq;
    ASSERT_EQ(p.fully_masked_rows(), masked);
    const Step r = train_step(cpu_backend("math"), p);
    EXPECT_EQ(r.saved.probs.dtype(), DType::F32);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < masked; ++i) {
        for (std::int64_t d = 0; d < p.head_dim; ++d) ASSERT_EQ(r.grads.dq.get(0, h, i, d), 0.0f) << h << " " << i;
      }
    }
    const GradientErrors e = errors(p, r);
    for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
      EXPECT_EQ(s->nan_count, 0) << p.describe();
      EXPECT_TRUE(accept(dt, *s, std::nullopt, false).pass) << p.describe() << " rel " << s->rel;
    }
  }
}

// naive's plain softmax makes a fully masked row NaN, and autograd's backward
// of the same ops carries it on: the fill's backward zeroes that row's dS (every
// key of it is masked), so its dQ is zero, but dV = P^T dO sums the NaN row
// into every key's gradient. The documented behaviour, not hidden here.
TEST(CompositeBackward, NaiveCarriesItsNaNIntoDvOnFullyMaskedRows) {
  const Problem p = fully_masked_problem(DType::F32);
  for (const char* name : {"naive", "naive_inplace"}) {
    ASSERT_TRUE(cpu_backend(name).traits().nan_on_fully_masked);
    const Step r = train_step(cpu_backend(name), p);
    EXPECT_EQ(r.grads.dq.get(0, 0, 0, 0), 0.0f) << name;
    EXPECT_TRUE(std::isfinite(r.grads.dq.get(0, 0, p.seq - 1, 0))) << name;
    EXPECT_TRUE(std::isfinite(r.grads.dk.get(0, 0, 0, 0))) << name;
    EXPECT_TRUE(std::isnan(r.grads.dv.get(0, 0, 0, 0))) << name;
  }
}

TEST(CompositeBackward, SavesTheProbabilitiesInTheComputeDtype) {
  const Problem p = to_problem(kCases[0].shape, DType::BF16, MaskKind::Causal);
  const std::size_t n = static_cast<std::size_t>(p.batch * p.heads * p.seq * p.kv_seq);
  for (const std::string name : kNames) {
    EXPECT_TRUE(cpu_backend(name).has_backward()) << name;
    const Step r = train_step(cpu_backend(name), p);
    const DType want = name == "math" ? DType::F32 : DType::BF16;
    EXPECT_EQ(r.saved.probs.dtype(), want) << name;
    EXPECT_EQ(r.saved.bytes(), n * element_size(want)) << name;
    EXPECT_FALSE(r.saved.lse.defined()) << name;
  }
}

// ---- the plan: expectations and workspace of a backward ----------------------

Problem planned_problem(Device d, DType dt, MaskKind mask, Pass pass) {
  const std::int64_t window = mask == MaskKind::SlidingWindow ? 32 : 0;
  Problem p =
      to_problem(Shape{.batch = 2, .heads = 4, .kv_heads = 2, .seq = 96, .kv_seq = 128, .window = window}, dt, mask, d);
  p.pass = pass;
  p.validate();
  return p;
}

std::unique_ptr<Backend> planned(const std::string& name, Device d) {
  auto ops = std::make_unique<composite::PlanOps>(d);
  if (name == "naive") return composite::make_naive(std::move(ops));
  if (name == "naive_inplace") return composite::make_naive_inplace(std::move(ops));
  return composite::make_math(std::move(ops));
}

Expectation expect(const std::string& name, Device d, DType dt, MaskKind mask, Pass pass) {
  return planned(name, d)->expectation(planned_problem(d, dt, mask, pass));
}

TEST(CompositeBackwardPlan, BackwardListsAutogradsOpsInOrder) {
  struct Want {
    const char* name;
    MaskKind mask;
    DType dtype;
    OpNames ops;
    int activities, copies;
  };
  const Want wants[] = {
      {"naive",
       MaskKind::Causal,
       DType::BF16,
       {"matmul", "matmul", "_softmax_backward_data", "masked_fill", "mul", "matmul", "matmul"},
       8,
       1},
      {"naive_inplace",
       MaskKind::Causal,
       DType::BF16,
       {"matmul", "matmul", "_softmax_backward_data", "masked_fill_", "mul", "matmul", "matmul"},
       7,
       0},
      {"naive",
       MaskKind::Bias,
       DType::BF16,
       {"matmul", "matmul", "_softmax_backward_data", "mul", "matmul", "matmul"},
       6,
       0},
      {"math",
       MaskKind::Causal,
       DType::BF16,
       {"to", "to", "matmul", "matmul", "to", "_softmax_backward_data", "to", "matmul", "mul", "to", "to", "matmul",
        "mul", "to"},
       14,
       0},
      {"math",
       MaskKind::SlidingWindow,
       DType::F32,
       {"matmul", "matmul", "_softmax_backward_data", "matmul", "mul", "to", "matmul", "mul", "to"},
       9,
       0},
  };
  for (const Want& w : wants) {
    const Expectation g = expect(w.name, Device::Cuda, w.dtype, w.mask, Pass::Backward);
    const std::string what = std::string(w.name) + " " + std::string(mask_name(w.mask));
    EXPECT_EQ(g.cpu_ops, w.ops) << what;
    EXPECT_EQ(g.device_activities, w.activities) << what;
    EXPECT_EQ(g.copies, w.copies) << what;
    const Expectation c = expect(w.name, Device::Cpu, w.dtype, w.mask, Pass::Backward);
    EXPECT_EQ(c.cpu_ops, w.ops) << what;
    EXPECT_EQ(c.copies, w.copies) << what;
  }
}

// A training step is the forward then the backward, op for op; and on both
// devices the same ops.
TEST(CompositeBackwardPlan, TrainIsTheForwardThenTheBackward) {
  for (const std::string name : kNames) {
    for (MaskKind mask :
         {MaskKind::None, MaskKind::Causal, MaskKind::SlidingWindow, MaskKind::Boolean, MaskKind::Bias}) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = name + " " + std::string(mask_name(mask)) + " " + std::string(dtype_name(dt));
        const Expectation f = expect(name, Device::Cuda, dt, mask, Pass::Forward);
        const Expectation b = expect(name, Device::Cuda, dt, mask, Pass::Backward);
        const Expectation t = expect(name, Device::Cuda, dt, mask, Pass::Train);
        OpNames both = f.cpu_ops;
        both.insert(both.end(), b.cpu_ops.begin(), b.cpu_ops.end());
        EXPECT_EQ(t.cpu_ops, both) << what;
        EXPECT_EQ(t.device_activities, f.device_activities + b.device_activities) << what;
        EXPECT_EQ(t.copies, f.copies + b.copies) << what;
        for (Pass pass : {Pass::Backward, Pass::Train}) {
          EXPECT_EQ(expect(name, Device::Cpu, dt, mask, pass).cpu_ops,
                    expect(name, Device::Cuda, dt, mask, pass).cpu_ops)
              << what;
        }
      }
    }
  }
}

// The refuse-before-allocating estimate of a backward or training step covers
// its planned peak, which holds the saved probabilities and the backward's
// score-sized temporaries.
TEST(CompositeBackwardPlan, WorkspaceCoversSavedProbabilitiesAndTemporaries) {
  for (const std::string name : kNames) {
    for (MaskKind mask : {MaskKind::None, MaskKind::Causal, MaskKind::CausalBottomRight, MaskKind::SlidingWindow,
                          MaskKind::Boolean, MaskKind::Bias}) {
      for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        for (Device d : {Device::Cpu, Device::Cuda}) {
          for (Pass pass : {Pass::Backward, Pass::Train}) {
            const Problem p = planned_problem(d, dt, mask, pass);
            const auto b = planned(name, d);
            const auto& c = dynamic_cast<const composite::CompositeBackend&>(*b);
            const std::size_t scores = static_cast<std::size_t>(p.batch * p.heads * p.seq * p.kv_seq) *
                                       element_size(name == "math" ? DType::F32 : dt);
            const std::size_t planned_bytes = c.planned_workspace_bytes(p);
            const std::string what = name + " " + p.describe();
            // The saved probabilities and at least two score-sized gradients (dP, dS).
            EXPECT_GE(planned_bytes, 3 * scores) << what;
            EXPECT_GE(b->workspace_bytes(p), planned_bytes) << what;
            Problem fwd = p;
            fwd.pass = Pass::Forward;
            EXPECT_GE(b->workspace_bytes(p), b->workspace_bytes(fwd)) << what;
          }
        }
      }
    }
  }
}

// ---- the runner, end to end ---------------------------------------------------

// A backward and a training step through run_backend: accepted against
// float64, the saved probabilities counted, and the traced ops the planned ones.

TEST(CompositeBackwardRunner, BackwardAndTrainPassOnTheCpu) {
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  o.check_rows = 256;
  o.threads = 1;
  for (Pass pass : {Pass::Backward, Pass::Train}) {
    for (const std::string name : kNames) {
      for (DType dt : {DType::F32, DType::BF16}) {
        Problem p = to_problem(Shape{.batch = 1, .heads = 4, .kv_heads = 2, .seq = 64, .kv_seq = 80, .head_dim = 32},
                               dt, MaskKind::CausalBottomRight);
        p.pass = pass;
        p.validate();
        const std::string what = name + " " + p.describe();
        const RunResult r = run_backend(cpu_backend(name), p, o);
        ASSERT_FALSE(r.failure) << what << ": " << *r.failure;
        ASSERT_TRUE(r.eligibility.eligible) << what << ": " << r.eligibility.reason;
        EXPECT_NE(r.eligibility.reason.find("backward from the saved"), std::string::npos) << r.eligibility.reason;
        ASSERT_TRUE(r.acceptance.has_value()) << what;
        EXPECT_TRUE(r.acceptance->pass) << what << ": " << r.acceptance->why;
        ASSERT_TRUE(r.gradient_errors.has_value()) << what;
        const std::size_t esize = element_size(name == "math" ? DType::F32 : dt);
        ASSERT_TRUE(r.metrics.saved_bytes.has_value()) << what;
        EXPECT_EQ(*r.metrics.saved_bytes, static_cast<double>(p.batch * p.heads * p.seq * p.kv_seq * esize)) << what;
        // "Guess first, then look": each traced call makes the planned ops.
        const analysis::TraceIndex index(r.trace);
        ASSERT_EQ(index.forwards().size(), 2u) << what;
        for (std::size_t f = 0; f < index.forwards().size(); ++f) {
          OpNames ops;
          for (const analysis::EventIndex a : index.forward_ops(f)) ops.emplace_back(index.op(a));
          EXPECT_EQ(ops, r.expectation.cpu_ops) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnprof
