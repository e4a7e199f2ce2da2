// cudnn's backward (sdpa_backward after a forward that writes the softmax
// statistics) against the float64 gradient reference: dQ, dK and dV for
// masks none and causal, bf16, head dims 64 and 128, grouped-query heads; the
// statistics as Saved::lse; the deterministic attribute; and the runner's
// backward and train passes, whose per-call host cost is printed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "common/test_problem.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

struct Case {
  std::int64_t head_dim;
  MaskKind mask;
  std::int64_t heads, kv_heads, seq, kv_seq;
  const char* label;
  std::int64_t batch = 2;
  DType dtype = DType::BF16;
  std::int64_t window = 0;
  std::optional<double> scale{};
};

Problem problem_of(const Case& c, Pass pass = Pass::Backward) {
  Problem p = testing::to_problem(c, c.dtype, c.mask, Device::Cuda);
  p.pass = pass;
  p.validate();
  return p;
}

// One training step of `b` on the GPU; the gradients (and the statistics)
// downloaded to the host.
struct HostStep {
  Inputs in;
  Tensor dout, lse;
  Gradients grads;
};

HostStep step(Backend& b, const Problem& p, std::uint64_t seed) {
  DeviceRuntime& rt = cuda::runtime();
  HostStep h;
  h.in = make_inputs(p, seed, cpu_allocator());
  h.dout = make_dout(p, seed, cpu_allocator());
  const Inputs in = rt.upload(h.in);
  const Tensor dout = rt.upload(h.dout);
  const auto empty = [&](std::int64_t heads, std::int64_t seq) {
    Tensor t = Tensor::empty({p.batch, heads, seq, p.head_dim}, p.dtype, rt.allocator());
    rt.poison(t);
    return t;
  };
  Tensor out = empty(p.heads, p.seq);
  Gradients g{empty(p.heads, p.seq), empty(p.kv_heads, p.kv_seq), empty(p.kv_heads, p.kv_seq)};
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  Saved saved;
  b.forward_train(p, in, out, saved, ctx);
  b.backward(p, in, out, dout, saved, g, ctx);
  rt.synchronize();
  h.grads = {rt.download(g.dq), rt.download(g.dk), rt.download(g.dv)};
  h.lse = rt.download(saved.lse);
  return h;
}

class CudnnBackward : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnBackward, MatchesFloat64Gradients) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  const Problem p = problem_of(c);
  auto cudnn = cuda::make_cudnn();
  ASSERT_TRUE(cudnn->has_backward());
  const Eligibility el = eligibility_of(*cudnn, p);
  ASSERT_TRUE(el.eligible) << p.describe() << ": " << el.reason;

  const HostStep h = step(*cudnn, p, 0x5eed + static_cast<std::uint64_t>(c.head_dim));
  const GradientErrors e =
      check_gradients_against_reference(p, h.in, h.dout, h.grads, sample_rows(p, 4096), sample_kv_rows(p, 4096));
  const char* names[] = {"dQ", "dK", "dV"};
  int k = 0;
  for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
    const char* name = names[k++];
    const Acceptance a = accept(p.dtype, *s, std::nullopt, /*nan_allowed_on_masked_rows=*/false);
    EXPECT_TRUE(a.pass) << p.describe() << " " << name << ": " << a.why << ", max abs " << s->max_abs;
    EXPECT_EQ(s->nan_count, 0) << name;
    EXPECT_GT(s->rows_checked, 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16, CudnnBackward,
                         ::testing::Values(Case{64, MaskKind::None, 4, 4, 256, 256, "d64_none"},
                                           Case{64, MaskKind::Causal, 4, 4, 256, 256, "d64_causal"},
                                           Case{128, MaskKind::None, 4, 4, 192, 320, "d128_none_kv320"},
                                           Case{128, MaskKind::Causal, 4, 4, 256, 256, "d128_causal"},
                                           Case{64, MaskKind::Causal, 8, 2, 256, 256, "d64_causal_gqa4"},
                                           Case{128, MaskKind::None, 8, 1, 128, 256, "d128_none_mqa"}),
                         [](const auto& info) { return std::string(info.param.label); });

// The statistics cuDNN writes are the natural-log LSE of each row's scaled
// scores, the convention Saved::lse documents.
TEST(CudnnBackward, StatsAreTheNaturalLogSumExp) {
  REQUIRE_GPU();
  const Problem p = problem_of({64, MaskKind::Causal, 2, 2, 128, 128, "lse", 1});
  auto cudnn = cuda::make_cudnn();
  const Eligibility el = eligibility_of(*cudnn, p);
  ASSERT_TRUE(el.eligible) << el.reason;
  const HostStep h = step(*cudnn, p, 3);
  ASSERT_EQ(h.lse.sizes(), (Dims{p.batch, p.heads, p.seq, 1}));
  ASSERT_EQ(h.lse.dtype(), DType::F32);
  for (std::int64_t head = 0; head < p.heads; ++head) {
    for (std::int64_t i = 0; i < p.seq; i += 7) {
      double mx = -INFINITY;
      std::vector<double> x;
      for (std::int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < p.head_dim; ++d) dot += h.in.q.get(0, head, i, d) * h.in.k.get(0, head, j, d);
        x.push_back(dot * p.softmax_scale());
        mx = std::max(mx, x.back());
      }
      double sum = 0;
      for (double v : x) sum += std::exp(v - mx);
      EXPECT_NEAR(h.lse.get(0, head, i, 0), mx + std::log(sum), 2e-3) << "head " << head << " row " << i;
    }
  }
}

// --deterministic maps to the frontend's deterministic algorithm: where cuDNN
// builds it, two steps give the same bits; where it does not, the refusal is
// cuDNN's own words for the backward graph.
TEST(CudnnBackward, DeterministicIsRepeatableOrRefusedWithAReason) {
  REQUIRE_GPU();
  Problem p = problem_of({128, MaskKind::Causal, 8, 2, 512, 512, "det"});
  p.deterministic = true;
  auto cudnn = cuda::make_cudnn();
  const Eligibility el = eligibility_of(*cudnn, p);
  if (!el.eligible) {
    EXPECT_NE(el.reason.find("backward"), std::string::npos) << el.reason;
    return;
  }
  const HostStep a = step(*cudnn, p, 9);
  const HostStep b = step(*cudnn, p, 9);
  EXPECT_EQ(std::memcmp(a.grads.dq.data(), b.grads.dq.data(), a.grads.dq.nbytes()), 0);
  const GradientErrors e =
      check_gradients_against_reference(p, a.in, a.dout, a.grads, sample_rows(p, 1024), sample_kv_rows(p, 1024));
  EXPECT_TRUE(accept(p.dtype, e.dq, std::nullopt, false).pass) << e.dq.rel;
}

TEST(CudnnBackward, RunBackendBackwardAndTrain) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  for (Pass pass : {Pass::Backward, Pass::Train}) {
    const Problem p = problem_of({128, MaskKind::Causal, 8, 2, 1024, 1024, "runner", 2}, pass);
    RunOptions o;
    o.schedule = {.wait = 0, .warmup = 1, .active = 3, .repeat = 1};
    o.check_rows = 512;
    const RunResult r = run_backend(*cudnn, p, o);
    const std::string what(pass_name(pass));
    ASSERT_TRUE(r.eligibility.eligible) << what << ": " << r.eligibility.reason;
    ASSERT_FALSE(r.failure) << what << ": " << *r.failure;
    ASSERT_TRUE(r.acceptance && r.acceptance->pass) << what << ": " << (r.acceptance ? r.acceptance->why : "none");
    ASSERT_TRUE(r.metrics.saved_bytes) << what;
    EXPECT_EQ(*r.metrics.saved_bytes, static_cast<double>(p.batch * p.heads * p.seq * 4)) << what;
    EXPECT_EQ(r.expectation.cpu_ops.size(), pass == Pass::Train ? 2u : 1u);
    ASSERT_TRUE(r.metrics.host_time_unprofiled_us) << what;
    // The target is <= 15 us per backward call (the variant pack is cached
    // like the forward's); printed for the record rather than asserted, as a
    // shared machine's host time varies.
    std::cout << "cudnn " << what << ": host " << *r.metrics.host_time_unprofiled_us << " us per call (p10 "
              << r.metrics.host_time_unprofiled_p10_us.value_or(0) << ", p90 "
              << r.metrics.host_time_unprofiled_p90_us.value_or(0) << "), TFLOP/s " << r.metrics.tflops.value_or(0)
              << "\n";
  }
}

}  // namespace
}  // namespace attnprof
