// The one mask geometry on the GPU (issue 49 item 3): a sliding window of up
// to INT64_MAX keys hides nothing a bottom-right causal mask does not. The
// kernels take int32 windows, which the argument builder clamps to the keys;
// before it, 2^31 + 5 became a negative int and INT64_MAX -1. Every CUDA
// backend that takes the problem, dense and packed, forward and (flash) a
// training step, against the float64 reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "attnprof/varlen.h"
#include "common/varlen_cases.h"
#include "cuda_forward.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

constexpr std::int64_t kWindows[] = {std::numeric_limits<std::int64_t>::max(),
                                     std::numeric_limits<std::int64_t>::max() - 7, (std::int64_t{1} << 31) + 5,
                                     std::int64_t{1} << 40, 40};

Problem windowed(std::int64_t window, bool packed, Pass pass) {
  Problem p{.batch = 2, .heads = 2, .seq = 16, .kv_seq = 24, .head_dim = 64};
  p.device = Device::Cuda;
  p.mask = MaskKind::SlidingWindow;
  p.window = window;
  p.pass = pass;
  if (packed) p = varlen_problem(p, {16, 5, 70}, {16, 20, 90});
  p.normalize();
  return p;
}

TEST(MaskGeometryCuda, LongestWindowsOnEveryCudaBackend) {
  REQUIRE_GPU();
  for (const bool packed : {false, true}) {
    for (const Pass pass : {Pass::Forward, Pass::Train}) {
      for (const std::int64_t window : kWindows) {
        for (const char* name : {"flash", "efficient", "cudnn", "naive", "math"}) {
          const Problem p = windowed(window, packed, pass);
          const std::string what = std::string(name) + " window " + std::to_string(window) + ": " + p.describe();
          Backend* b = find_backend(name, Device::Cuda);
          if (b == nullptr || !eligibility_of(*b, p).eligible) continue;
          const Inputs in = make_inputs(p, 5, cpu_allocator());
          const Tensor dout = make_dout(p, 5, cpu_allocator());
          const testing::CudaRun r = testing::run_once(*b, p, in, dout);
          testing::expect_accurate(p, check_against_reference(p, in, r.out, sample_rows(p, 1 << 20)), what + " out",
                                   b->traits().nan_on_fully_masked);
          if (pass == Pass::Forward) continue;
          const GradientErrors e = check_gradients_against_reference(p, in, dout, r.grads, sample_rows(p, 1 << 20),
                                                                     sample_kv_rows(p, 1 << 20));
          testing::expect_accurate(p, e.dq, what + " dQ");
          testing::expect_accurate(p, e.dk, what + " dK");
          testing::expect_accurate(p, e.dv, what + " dV");
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnprof
