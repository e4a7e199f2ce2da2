// The composite backends (naive, naive_inplace, math) are written once over the
// op interface: their expectations derive from the ops the forward calls, so
// the CPU's and the GPU's agree op for op, for every mask and dtype. The GPU's
// are planned here without a GPU (a CUDA build's registered backends too).
#include "backends/composite/composite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/runner.h"
#include "backends/composite/composite_backend.h"
#include "backends/composite/plan.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using OpNames = std::vector<std::string>;

constexpr MaskKind kMasks[] = {MaskKind::None,          MaskKind::Causal,  MaskKind::CausalBottomRight,
                               MaskKind::SlidingWindow, MaskKind::Boolean, MaskKind::Bias};
constexpr DType kDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F8E4M3};
const char* const kNames[] = {"naive", "naive_inplace", "math"};

Problem problem(Device d, DType dt, MaskKind mask) {
  const std::int64_t window = mask == MaskKind::SlidingWindow ? 32 : 0;
  Problem p = testing::to_problem({.batch = 2, .heads = 4, .seq = 96, .kv_seq = 128, .window = window}, dt, mask, d);
  p.validate();
  return p;
}

// A composite backend whose ops are the plan of a device: constructible on any
// machine, and what the expectation of that device's backend is computed from.
std::unique_ptr<Backend> planned(const std::string& name, Device d) {
  auto ops = std::make_unique<composite::PlanOps>(d);
  if (name == "naive") return composite::make_naive(std::move(ops));
  if (name == "naive_inplace") return composite::make_naive_inplace(std::move(ops));
  return composite::make_math(std::move(ops));
}

Expectation cuda_expectation(const std::string& name, const Problem& p) {
  return planned(name, Device::Cuda)->expectation(p);
}

TEST(Composite, CpuAndCudaExpectationsAreIdentical) {
  for (const std::string name : kNames) {
    Backend* cpu = find_backend(name, Device::Cpu);
    ASSERT_NE(cpu, nullptr) << name;
    EXPECT_EQ(cpu->device(), Device::Cpu);
    Backend* cuda = find_backend(name, Device::Cuda);  // registered in CUDA builds only
    for (MaskKind mask : kMasks) {
      for (DType dt : kDtypes) {
        const Problem pc = problem(Device::Cpu, dt, mask), pg = problem(Device::Cuda, dt, mask);
        const std::string what = name + " " + pg.describe();
        const Expectation c = cpu->expectation(pc);
        const Expectation g = cuda_expectation(name, pg);
        EXPECT_FALSE(c.cpu_ops.empty()) << what;
        EXPECT_EQ(c.cpu_ops, g.cpu_ops) << what;
        EXPECT_EQ(c.copies, g.copies) << what;
        EXPECT_EQ(c.device_activities, -1) << what << ": the CPU has no device activities to expect";
        EXPECT_GE(g.device_activities, static_cast<int>(g.cpu_ops.size())) << what << ": each op issues at least one";
        if (cuda != nullptr) {
          EXPECT_EQ(cuda->device(), Device::Cuda);
          const Expectation r = cuda->expectation(pg);
          EXPECT_EQ(r.cpu_ops, g.cpu_ops) << what;
          EXPECT_EQ(r.device_activities, g.device_activities) << what;
          EXPECT_EQ(r.copies, g.copies) << what;
        }
      }
    }
  }
}

// The README's story at the reference shape (bf16, causal): what a GPU trace
// shows per forward, and the same op names in the same order on the CPU.
TEST(Composite, ReferenceCaseSequences) {
  const Problem pg = problem(Device::Cuda, DType::BF16, MaskKind::Causal);
  const Problem pc = problem(Device::Cpu, DType::BF16, MaskKind::Causal);
  struct Want {
    const char* name;
    OpNames ops;
    int activities, copies;
  };
  const Want wants[] = {
      {"naive", {"matmul", "mul", "masked_fill", "softmax", "matmul"}, 6, 1},
      {"naive_inplace", {"matmul", "mul", "masked_fill_", "softmax", "matmul"}, 5, 0},
      {"math",
       {"to", "to", "to", "mul", "ones", "tril", "where", "mul", "matmul", "add_", "_safe_softmax", "matmul", "to"},
       16,
       0},
  };
  for (const Want& w : wants) {
    const Expectation g = cuda_expectation(w.name, pg);
    EXPECT_EQ(g.cpu_ops, w.ops) << w.name;
    EXPECT_EQ(g.device_activities, w.activities) << w.name;
    EXPECT_EQ(g.copies, w.copies) << w.name;
    const Expectation c = find_backend(w.name, Device::Cpu)->expectation(pc);
    EXPECT_EQ(c.cpu_ops, w.ops) << w.name;
    EXPECT_EQ(c.copies, w.copies) << w.name;
  }
}

// The other masks, as PyTorch's paths run them: naive fills with the keep mask
// as given (no logical_not) and adds a bias; math makes a Boolean mask additive
// before the upcasts (scaled_dot_product_attention's convert_boolean_attn_mask),
// rebuilds a structural one after scaling Q (as is_causal's), and adds a bias in
// place as given.
TEST(Composite, SequencesPerMask) {
  const auto ops = [](const char* name, MaskKind mask, DType dt = DType::BF16) {
    return cuda_expectation(name, problem(Device::Cuda, dt, mask)).cpu_ops;
  };
  EXPECT_EQ(ops("naive", MaskKind::None), (OpNames{"matmul", "mul", "softmax", "matmul"}));
  EXPECT_EQ(ops("naive", MaskKind::Boolean), (OpNames{"matmul", "mul", "masked_fill", "softmax", "matmul"}));
  EXPECT_EQ(ops("naive", MaskKind::SlidingWindow), (OpNames{"matmul", "mul", "masked_fill", "softmax", "matmul"}));
  EXPECT_EQ(ops("naive", MaskKind::Bias), (OpNames{"matmul", "mul", "add", "softmax", "matmul"}));
  EXPECT_EQ(ops("naive_inplace", MaskKind::Bias), (OpNames{"matmul", "mul", "add_", "softmax", "matmul"}));
  EXPECT_EQ(ops("math", MaskKind::None),
            (OpNames{"to", "to", "to", "mul", "mul", "matmul", "_safe_softmax", "matmul", "to"}));
  EXPECT_EQ(ops("math", MaskKind::None, DType::F32), (OpNames{"mul", "mul", "matmul", "_safe_softmax", "matmul"}));
  EXPECT_EQ(ops("math", MaskKind::CausalBottomRight), (OpNames{"to", "to", "to", "mul", "ones", "tril", "where", "mul",
                                                               "matmul", "add_", "_safe_softmax", "matmul", "to"}));
  EXPECT_EQ(ops("math", MaskKind::SlidingWindow), (OpNames{"to", "to", "to", "mul", "ones", "tril", "triu", "where",
                                                           "mul", "matmul", "add_", "_safe_softmax", "matmul", "to"}));
  EXPECT_EQ(ops("math", MaskKind::Boolean),
            (OpNames{"where", "to", "to", "to", "mul", "mul", "matmul", "add_", "_safe_softmax", "matmul", "to"}));
  EXPECT_EQ(ops("math", MaskKind::Bias),
            (OpNames{"to", "to", "to", "mul", "mul", "matmul", "add_", "_safe_softmax", "matmul", "to"}));
  EXPECT_EQ(cuda_expectation("math", problem(Device::Cuda, DType::BF16, MaskKind::SlidingWindow)).device_activities,
            17);
}

// FP8 semantics: q, k and v dequantized to FP32, the FP32 problem's ops
// (math without its upcasts), and O cast to bf16; one kernel each on a GPU.
TEST(Composite, Fp8DequantizesThenRunsTheFp32Path) {
  const auto ops = [](const char* name, MaskKind mask, DType dt) {
    return cuda_expectation(name, problem(Device::Cuda, dt, mask)).cpu_ops;
  };
  const OpNames dequantize{"dequantize", "dequantize", "dequantize"};
  for (const char* name : kNames) {
    for (MaskKind mask : kMasks) {
      OpNames want = dequantize;
      const OpNames fp32 = ops(name, mask, DType::F32);
      want.insert(want.end(), fp32.begin(), fp32.end());
      want.push_back("to");
      EXPECT_EQ(ops(name, mask, DType::F8E4M3), want) << name << " " << mask_name(mask);
    }
  }
  const Problem pg = problem(Device::Cuda, DType::F8E4M3, MaskKind::Causal);
  EXPECT_EQ(cuda_expectation("naive", pg).device_activities, 6 + 4);
  EXPECT_EQ(cuda_expectation("math", pg).device_activities,
            cuda_expectation("math", problem(Device::Cuda, DType::F32, MaskKind::Causal)).device_activities + 4);
  for (Device d : {Device::Cpu, Device::Cuda}) {
    for (const std::string name : kNames) {
      const Problem p = problem(d, DType::F8E4M3, MaskKind::Causal);
      EXPECT_TRUE(planned(name, d)->traits().fp8) << name;
      const Eligibility e = eligibility_of(*planned(name, d), p);
      EXPECT_TRUE(e.eligible) << name << ": " << e.reason;
      EXPECT_NE(e.reason.find("FP8 semantics"), std::string::npos) << e.reason;
    }
  }
}

// The structural mask is naive's registered buffer: built in the plan's warmup
// pass, never per forward, and its problem's mask is what a CUDA naive caches.
TEST(Composite, NaiveBuildsItsStructuralMaskOncePerProblem) {
  const auto e = cuda_expectation("naive", problem(Device::Cuda, DType::F16, MaskKind::CausalBottomRight));
  EXPECT_EQ(e.device_activities, 6);
  EXPECT_EQ(std::count(e.cpu_ops.begin(), e.cpu_ops.end(), "tril"), 0);
}

// The plan computes nothing and allocates nothing, so a problem far larger
// than the machine plans as cheaply as a small one.
TEST(Composite, PlansAProblemLargerThanTheMachine) {
  Problem p = problem(Device::Cuda, DType::BF16, MaskKind::Causal);
  p.batch = 4096;
  p.seq = p.kv_seq = 65536;
  EXPECT_EQ(cuda_expectation("math", p).device_activities, 16);
  EXPECT_EQ(cuda_expectation("naive", p).device_activities, 6);
}

// The refuse-before-allocating estimates cover what the planned forward
// allocates at its peak (the GPU's op footprints, the larger ones).
TEST(Composite, WorkspaceEstimatesCoverThePlannedPeak) {
  for (const std::string name : kNames) {
    for (MaskKind mask : kMasks) {
      for (DType dt : kDtypes) {
        for (Device d : {Device::Cpu, Device::Cuda}) {
          const Problem p = problem(d, dt, mask);
          const auto b = planned(name, d);
          const auto& c = dynamic_cast<const composite::CompositeBackend&>(*b);
          const std::size_t planned_bytes = c.planned_workspace_bytes(p);
          EXPECT_GT(planned_bytes, 0u);
          EXPECT_GE(b->workspace_bytes(p), planned_bytes) << name << " " << p.describe();
        }
      }
    }
  }
}

TEST(Composite, EligibilityIsPerDevice) {
  const Problem pg = problem(Device::Cuda, DType::BF16, MaskKind::Causal);
  const Problem pc = problem(Device::Cpu, DType::BF16, MaskKind::Causal);
  for (const std::string name : kNames) {
    const Eligibility c = find_backend(name, Device::Cpu)->eligibility(pc);
    EXPECT_TRUE(c.eligible) << name;
    EXPECT_NE(c.reason.find("OpenBLAS"), std::string::npos) << c.reason;
    EXPECT_FALSE(find_backend(name, Device::Cpu)->eligibility(pg).eligible) << name;
  }
  EXPECT_NE(find_backend("naive", Device::Cpu)->eligibility(pc).reason.find("hidden copy"), std::string::npos);
  EXPECT_NE(find_backend("math", Device::Cpu)->eligibility(pc).reason.find("upcasts to FP32"), std::string::npos);
}

TEST(Composite, TraitsAreDeclaredOnceForBothDevices) {
  for (Device d : {Device::Cpu, Device::Cuda}) {
    const Traits naive = planned("naive", d)->traits();
    EXPECT_TRUE(naive.nan_on_fully_masked && naive.memory_baseline && !naive.reference_precision);
    const Traits inplace = planned("naive_inplace", d)->traits();
    EXPECT_TRUE(inplace.nan_on_fully_masked && !inplace.memory_baseline && !inplace.reference_precision);
    const Traits math = planned("math", d)->traits();
    EXPECT_TRUE(!math.nan_on_fully_masked && !math.memory_baseline && math.reference_precision);
  }
}

}  // namespace
}  // namespace attnprof
