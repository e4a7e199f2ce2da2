// NaN and inf pass through every CUDA backend as through the float64
// reference (issue 49 item 8): the cases of tests/cpu/nan_cases.h (a NaN or
// inf in q or k, a NaN byte in an FP8 k, a NaN bias, a bias row of -inf that
// must stay zeros), on device, into an output holding a finite sentinel.
// The fused kernels' softmax (softmax_online.cuh: ex2_fma's NaN-keeping
// clamp, the epilogue's sum != 0) and the decode kernel and its split merge
// (flash_decode.cuh) are what this checks; also an output over an input
// refused by name (item 5).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "cpu/nan_cases.h"
#include "gpu/gpu_test.h"

namespace attnprof {
namespace {

void expect_nan_passes_through_on_cuda(std::string_view name) {
  DeviceRuntime& rt = cuda::runtime();
  {
    Backend* b = find_backend(name, Device::Cuda);
    ASSERT_NE(b, nullptr);
    int ran = 0;
    for (const testing::NanCase& c : testing::nan_cases()) {
      Problem host_p = testing::to_problem(c.shape, c.dtype, c.mask);
      host_p.softcap = c.softcap;
      host_p.validate();
      Problem p = host_p;
      p.device = Device::Cuda;
      p.validate();
      if (!eligibility_of(*b, p).eligible) continue;
      ++ran;
      const std::string label = std::string(name) + " " + c.name;
      Inputs host = make_inputs(host_p, 17, cpu_allocator());
      c.poison(host);
      const Inputs in = rt.upload(host);
      Tensor sentinel = Tensor::empty(p.q_dims(), output_dtype(p.dtype), cpu_allocator());
      testing::for_each_index(sentinel,
                              [&](auto a, auto bb, auto i, auto d) { sentinel.set(a, bb, i, d, testing::kSentinel); });
      Tensor out = rt.upload(sentinel);
      RunContext ctx{rt.allocator(), rt.stream(), 0};
      b->forward(p, in, out, ctx);
      rt.synchronize();
      const ErrorStats e = check_against_reference(host_p, host, rt.download(out), sample_rows(host_p, 1 << 20));
      EXPECT_EQ(e.nonfinite_hidden, 0) << label << ": finite output where the reference is NaN";
      if (c.reference_has_nan) EXPECT_GT(e.nonfinite_expected, 0) << label;
      const bool masked_nan_ok = b->traits().nan_on_fully_masked;
      EXPECT_EQ(e.nan_rows, masked_nan_ok ? e.nan_rows_fully_masked : 0) << label;
      EXPECT_TRUE(std::isfinite(e.rel)) << label;
      const Acceptance a = accept(p.dtype, e, std::nullopt, masked_nan_ok);
      EXPECT_TRUE(a.pass) << label << ": " << a.why;
    }
    ::testing::Test::RecordProperty(std::string(name) + "_cases", ran);
  }
}

// Our kernels and ops: the composites over the CUDA ops, efficient, flash
// (sm80 or sm90 forward, and the decode kernel for the one- and two-query cases).
TEST(NanCuda, NanAndInfPassThroughOurBackends) {
  REQUIRE_GPU();
  for (const char* name : {"naive", "naive_inplace", "math", "efficient", "flash"}) {
    SCOPED_TRACE(name);
    expect_nan_passes_through_on_cuda(name);
  }
}

// cuDNN's generated kernels, on their own: a failure here is cuDNN's
// behaviour, to report, not a kernel of ours.
TEST(NanCuda, NanAndInfThroughCudnn) {
  REQUIRE_GPU();
  expect_nan_passes_through_on_cuda("cudnn");
}

TEST(NanCuda, AnOutputOverAnInputIsRefusedByName) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  Problem p = testing::to_problem({.heads = 2, .seq = 128, .head_dim = 64}, DType::BF16, MaskKind::Causal);
  p.device = Device::Cuda;
  p.validate();
  Problem host_p = p;
  host_p.device = Device::Cpu;
  const Inputs in = rt.upload(make_inputs(host_p, 3, cpu_allocator()));
  for (const std::string_view name : backend_names()) {
    Backend* b = find_backend(name, Device::Cuda);
    if (b == nullptr || !eligibility_of(*b, p).eligible) continue;
    Tensor out = in.v;
    RunContext ctx{rt.allocator(), rt.stream(), 0};
    try {
      b->forward(p, in, out, ctx);
      ADD_FAILURE() << name << " wrote out over v";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out shares memory with v"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace attnprof
