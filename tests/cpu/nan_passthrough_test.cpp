// NaN and inf reach the output on every CPU backend as they reach PyTorch's
// SDPA and the float64 reference (issue 49, item 8): the composites, and
// flash at every level this CPU runs (the emulated suites take the levels it
// lacks). The cases are nan_cases.h's.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/runner.h"
#include "backends/cpu/cpu_backends.h"
#include "cpu/flash_isa_fixture.h"
#include "cpu/nan_cases.h"

namespace attnprof {
namespace {

TEST(NanPassthrough, Composites) {
  for (const char* name : {"naive", "naive_inplace", "math"}) {
    Backend* b = find_backend(name, Device::Cpu);
    ASSERT_NE(b, nullptr) << name;
    testing::expect_nan_passes_through(*b, name);
  }
}

// A key hidden by a -inf bias (or by a structural mask, in the cases above)
// keeps its NaN score out of every row: math adds its masks, and an IEEE add
// would make NaN + -inf NaN in rows the reference computes finite.
TEST(NanPassthrough, AKeyHiddenByAMinusInfBiasKeepsItsNanOut) {
  const Problem p = testing::to_problem({.heads = 2, .seq = 100, .head_dim = 64}, DType::F32, MaskKind::Bias);
  Inputs in = make_inputs(p, 17, cpu_allocator());
  for (std::int64_t h = 0; h < in.bias.size(1); ++h)
    for (std::int64_t i = 0; i < p.seq; ++i) in.bias.set(0, h, i, 30, -std::numeric_limits<float>::infinity());
  in.k.set(0, 0, 30, 7, std::numeric_limits<float>::quiet_NaN());
  for (const char* name : {"naive", "naive_inplace", "math", "flash"}) {
    Backend* b = find_backend(name, Device::Cpu);
    Tensor out = testing::nan_tensor(p.q_dims(), p.dtype);
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    b->forward(p, in, out, ctx);
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    EXPECT_EQ(e.nan_rows, 0) << name;
    EXPECT_EQ(e.nonfinite_expected, 0) << name;
    EXPECT_LT(e.rel, 1e-5) << name;
  }
}

class FlashIsaNan : public testing::FlashIsa {};

TEST_P(FlashIsaNan, NanAndInfPassThrough) {
  const testing::ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  testing::expect_nan_passes_through(*flash, "flash " + std::string(cpu::isa_name(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Levels, FlashIsaNan, ::testing::ValuesIn(cpu::kAllCpuIsas),
                         [](const ::testing::TestParamInfo<cpu::CpuIsa>& info) {
                           return std::string(cpu::isa_name(info.param));
                         });

}  // namespace
}  // namespace attnprof
