// The composites' backward on the CUDA Ops (cuBLAS products, the softmax's
// backward kernel): dQ, dK and dV of naive, naive_inplace and math against
// float64 for a few masks, grouped queries and [B, S, H, D] inputs, math's
// zero gradients on fully masked rows, and a backward and training step
// through the runner.
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
#include "backends/cuda/cuda_backends.h"
#include "common/test_problem.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

using testing::Shape;
using testing::to_problem;

const char* const kNames[] = {"naive", "naive_inplace", "math"};
const char* const kGrads[] = {"dq", "dk", "dv"};
constexpr ErrorStats GradientErrors::*kStats[] = {&GradientErrors::dq, &GradientErrors::dk, &GradientErrors::dv};

std::unique_ptr<Backend> make(const std::string& name) {
  if (name == "naive") return composite::make_naive(cuda::make_ops());
  if (name == "naive_inplace") return composite::make_naive_inplace(cuda::make_ops());
  return composite::make_math(cuda::make_ops());
}

struct Host {
  Inputs in;
  Tensor dout;
  Gradients grads;
};

// forward_train then backward on the GPU into poisoned gradients; the inputs,
// dO and the gradients on the host. `bshd` lays the inputs and the gradients
// out [B, S, H, D] (strided [B, H, S, D] views: cuBLAS writes them through
// their row stride).
Host train_step(Backend& b, const Problem& p, bool bshd) {
  DeviceRuntime& rt = cuda::runtime();
  Host h;
  h.in = make_inputs(p, 5, cpu_allocator(), bshd);
  h.dout = make_dout(p, 5, cpu_allocator());
  const Inputs in = rt.upload(h.in);
  const Tensor dout = rt.upload(h.dout);
  const auto empty = [&](const Tensor& like, bool strided) {
    const Dims n = like.sizes();
    Tensor t = Tensor::empty(strided ? Dims{n[0], n[2], n[1], n[3]} : n, p.dtype, rt.allocator());
    rt.poison(t);
    return strided ? t.transpose(1, 2) : t;
  };
  Tensor out = empty(h.dout, false);
  Gradients g{empty(h.in.q, bshd), empty(h.in.k, bshd), empty(h.in.v, bshd)};
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  {
    Saved saved;
    b.forward_train(p, in, out, saved, ctx);
    b.backward(p, in, out, dout, saved, g, ctx);
    rt.synchronize();
  }
  h.grads = {rt.download(g.dq), rt.download(g.dk), rt.download(g.dv)};
  return h;
}

struct Case {
  const char* name;
  Shape shape;
  MaskKind mask;
  bool bshd = false;
};

const Case kCases[] = {
    {"causal", {.batch = 2, .heads = 4, .seq = 128, .head_dim = 64}, MaskKind::Causal},
    {"causal_br_kv160",
     {.batch = 1, .heads = 4, .seq = 96, .kv_seq = 160, .head_dim = 64},
     MaskKind::CausalBottomRight},
    {"window32",
     {.batch = 1, .heads = 4, .seq = 128, .kv_seq = 160, .head_dim = 64, .window = 32},
     MaskKind::SlidingWindow},
    {"none_gqa_bshd",
     {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 64, .kv_seq = 128, .head_dim = 64},
     MaskKind::None,
     true},
    {"causal_mqa_hdim128", {.batch = 1, .heads = 4, .kv_heads = 1, .seq = 64, .head_dim = 128}, MaskKind::Causal},
    {"boolean", {.batch = 1, .heads = 2, .seq = 64, .head_dim = 32}, MaskKind::Boolean},
    {"bias_hdim256", {.batch = 1, .heads = 2, .seq = 64, .kv_seq = 96, .head_dim = 256}, MaskKind::Bias},
};

class CudaCompositeBackward : public ::testing::TestWithParam<Case> {};

// accept()'s rule: FP32 under its 2e-5 bound; 16-bit math within twice the
// dtype's floor, naive within twice math's error here plus the floor.
TEST_P(CudaCompositeBackward, GradientsMatchFloat64) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const Problem p = to_problem(c.shape, dt, c.mask, Device::Cuda);
    std::optional<GradientErrors> math;
    for (const std::string name : {"math", "naive", "naive_inplace"}) {
      const std::string what = name + " " + p.describe();
      const auto b = make(name);
      const Host h = train_step(*b, p, c.bshd);
      const GradientErrors e = check_gradients_against_reference(p, h.in, h.dout, h.grads, sample_rows(p, 1 << 20),
                                                                 sample_kv_rows(p, 1 << 20));
      for (int g = 0; g < 3; ++g) {
        const ErrorStats& s = e.*kStats[g];
        EXPECT_EQ(s.nan_rows, 0) << what << " " << kGrads[g];
        std::optional<double> math_rel;
        if (math && dt != DType::F32) math_rel = ((*math).*kStats[g]).rel;
        const Acceptance a = accept(dt, s, math_rel, false);
        EXPECT_TRUE(a.pass) << what << " " << kGrads[g] << ": " << a.why;
      }
      if (!math) math = e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, CudaCompositeBackward, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CudaCompositeBackwardMasked, MathGivesZeroGradientsOnFullyMaskedRows) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    const Problem p = to_problem(Shape{.batch = 1, .heads = 2, .seq = 96, .kv_seq = 64, .head_dim = 64}, dt,
                                 MaskKind::CausalBottomRight, Device::Cuda);
    const std::int64_t masked = p.seq - p.kv_seq;
    ASSERT_EQ(p.fully_masked_rows(), masked);
    const auto b = make("math");
    const Host h = train_step(*b, p, false);
    for (std::int64_t hd = 0; hd < p.heads; ++hd) {
      for (std::int64_t i = 0; i < masked; ++i) {
        for (std::int64_t d = 0; d < p.head_dim; ++d) ASSERT_EQ(h.grads.dq.get(0, hd, i, d), 0.0f) << hd << " " << i;
      }
    }
    const GradientErrors e = check_gradients_against_reference(p, h.in, h.dout, h.grads, sample_rows(p, 1 << 20),
                                                               sample_kv_rows(p, 1 << 20));
    for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
      EXPECT_EQ(s->nan_count, 0) << p.describe();
      EXPECT_TRUE(accept(dt, *s, std::nullopt, false).pass) << p.describe() << " rel " << s->rel;
    }
  }
}

// cuBLAS may run a deep GEMM (the backward's dK and dV: depth G*S, a small
// [Skv, D] result) split-K, with a reduction kernel after it; ops.h leaves
// those unpredicted, as it does the library's memsets.
int split_k_reduces(const Trace& t) {
  int n = 0;
  for (const Activity& a : t.activities)
    n += a.type == ActivityType::Kernel && a.name.find("splitKreduce") != std::string::npos;
  return n;
}

// The runner's backward and training passes: accepted, the saved
// probabilities counted, and the trace what the plan expects.
TEST(CudaCompositeBackwardRunner, BackwardAndTrainPass) {
  REQUIRE_GPU();
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  o.check_rows = 256;
  o.unprofiled_calls = 0;
  for (Pass pass : {Pass::Backward, Pass::Train}) {
    for (const std::string name : kNames) {
      Problem p = to_problem(Shape{.batch = 2, .heads = 4, .kv_heads = 2, .seq = 128, .head_dim = 64}, DType::BF16,
                             MaskKind::Causal, Device::Cuda);
      p.pass = pass;
      p.validate();
      const std::string what = name + " " + p.describe();
      const auto b = make(name);
      const RunResult r = run_backend(*b, p, o);
      ASSERT_FALSE(r.failure) << what << ": " << *r.failure;
      ASSERT_TRUE(r.acceptance.has_value()) << what;
      EXPECT_TRUE(r.acceptance->pass) << what << ": " << r.acceptance->why;
      const std::size_t esize = element_size(name == "math" ? DType::F32 : p.dtype);
      ASSERT_TRUE(r.metrics.saved_bytes.has_value()) << what;
      EXPECT_EQ(*r.metrics.saved_bytes, static_cast<double>(p.batch * p.heads * p.seq * p.kv_seq * esize)) << what;
      // "Guess first, then look": the planned ops in each traced call, and
      // (with CUPTI) the planned kernels and copies, memsets aside as in
      // cuda_backends_test's KernelCountsMatchExpectation.
      const analysis::TraceIndex index(r.trace);
      for (std::size_t f = 0; f < index.forwards().size(); ++f) {
        std::vector<std::string> ops;
        for (const analysis::EventIndex a : index.forward_ops(f)) ops.emplace_back(index.op(a));
        EXPECT_EQ(ops, r.expectation.cpu_ops) << what;
      }
      if (r.metrics.kernels_per_forward) {
        const double kernels = *r.metrics.kernels_per_forward - r.metrics.memsets_per_forward -
                               split_k_reduces(r.trace) / static_cast<double>(r.metrics.steps);
        EXPECT_EQ(kernels, r.expectation.device_activities) << what;
        EXPECT_EQ(r.metrics.copies_per_forward, r.expectation.copies) << what;
      }
    }
  }
}

}  // namespace
}  // namespace attnprof
