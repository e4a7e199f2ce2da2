// The soft caps and scales of attnprof/limits.h at the ends of their range,
// on every CPU backend (flash at the level this CPU runs) against float64:
// the caps' and scales' FP32 forms stay normal there, so each backend's error
// is its dtype's, as at cap 30 (issue 49 items 1 and 2: outside the range,
// flash gave error 2.47 at cap 3.4e38, zeros at 1e39 and ignored 1e-300, and
// Problem validation refuses those). Also the math composite's negative
// scale (item 4: it took sqrt of the scale, so every score was NaN and every
// row zeros), an output over an input refused by every backend (item 5), and
// the relative error of an output with NaN the reference lacks (item 7).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/aliasing.h"
#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/limits.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using testing::Shape;

constexpr const char* kCpuBackends[] = {"naive", "naive_inplace", "math", "flash"};

// Every CPU backend on p (fresh inputs) against float64, 16-bit ones against
// twice math's error plus the floor, as the runner's acceptance.
void expect_every_backend_accurate(const Problem& p, const std::string& what) {
  const Inputs in = make_inputs(p, 31, cpu_allocator());
  std::optional<double> math_rel;
  for (const char* name : {"math", "naive", "naive_inplace", "flash"}) {
    Backend* b = find_backend(name, Device::Cpu);
    ASSERT_NE(b, nullptr) << name;
    ASSERT_TRUE(eligibility_of(*b, p).eligible) << what << " " << name;
    Tensor out = testing::nan_tensor(p.q_dims(), output_dtype(p.dtype));
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    b->forward(p, in, out, ctx);
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    EXPECT_EQ(e.nan_rows, 0) << what << " " << name;
    if (std::string(name) == "math") math_rel = e.rel;
    const Acceptance a =
        accept(p.dtype, e, p.dtype == DType::F32 ? std::nullopt : math_rel, b->traits().nan_on_fully_masked);
    EXPECT_TRUE(a.pass) << what << " " << name << ": " << a.why;
  }
}

TEST(NumericRange, SoftcapEndsOnEveryCpuBackend) {
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (const double cap : {limits::kSoftcapMin, limits::softcap_max(dtype)}) {
      Problem p = testing::to_problem(Shape{.heads = 2, .seq = 100, .head_dim = 64}, dtype, MaskKind::Causal);
      p.softcap = cap;
      p.validate();
      ASSERT_TRUE(limits::softcap_in_range(cap, dtype));
      expect_every_backend_accurate(p, std::string(dtype_name(dtype)) + " cap " + std::to_string(cap));
    }
  }
}

// The smallest scale, either sign, with the largest cap (the CUDA kernels'
// scale / cap at its smallest), and the largest scale with the smallest cap
// (at its largest) in FP32, where a score's order survives the products.
TEST(NumericRange, ScaleEndsOnEveryCpuBackend) {
  struct Case {
    DType dtype;
    double scale, cap;
  };
  const std::vector<Case> cases = {
      {DType::BF16, limits::kScaleAbsMin, limits::kSoftcapMax},
      {DType::F16, -limits::kScaleAbsMin, 0},
      {DType::F32, limits::kScaleAbsMax, limits::kSoftcapMin},
      {DType::F32, -limits::kScaleAbsMax, 0},
      {DType::BF16, -limits::kScaleAbsMin, 0},
  };
  for (const Case& c : cases) {
    Problem p = testing::to_problem(Shape{.heads = 2, .seq = 40, .kv_seq = 90, .head_dim = 64, .scale = c.scale},
                                    c.dtype, MaskKind::None);
    p.softcap = c.cap;
    p.validate();
    ASSERT_TRUE(limits::scale_in_range(c.scale));
    expect_every_backend_accurate(
        p, std::string(dtype_name(c.dtype)) + " scale " + std::to_string(c.scale) + " cap " + std::to_string(c.cap));
  }
}

TEST(NumericRange, TheRangeRefusesWhatBrokeTheKernels) {
  for (const double cap : {3.4e38, 1e39, 1e-300, 1e-46, 1e308}) {
    EXPECT_FALSE(limits::softcap_in_range(cap, DType::BF16)) << cap;
  }
  EXPECT_TRUE(limits::softcap_in_range(0, DType::F16));  // no cap
  EXPECT_TRUE(limits::softcap_in_range(50, DType::F16));
  EXPECT_FALSE(limits::softcap_in_range(5000, DType::F16));
  EXPECT_FALSE(limits::scale_in_range(0));
  EXPECT_FALSE(limits::scale_in_range(1e-300));
  EXPECT_TRUE(limits::scale_in_range(-0.125));
}

// Item 4: math's half-scale on each operand, for a negative scale.
TEST(NumericRange, NegativeScaleOnEveryCpuBackend) {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const MaskKind mask : {MaskKind::None, MaskKind::Causal}) {
      const Problem p = testing::to_problem(Shape{.heads = 2, .seq = 70, .head_dim = 32, .scale = -0.125}, dtype, mask);
      expect_every_backend_accurate(p, std::string("scale -0.125 ") + std::string(dtype_name(dtype)));
    }
  }
}

// Item 5: out over v (or k, q, a bias), or partly over it through a strided
// view, is refused with one line naming the input, by every backend; disjoint
// interleaved views of one buffer (q, k, v from one packed qkv) are not.
TEST(NumericRange, AnOutputOverAnInputIsRefusedByEveryBackend) {
  const Problem p = testing::to_problem(Shape{.heads = 2, .seq = 64, .head_dim = 32}, DType::F32, MaskKind::Causal);
  Inputs in = make_inputs(p, 3, cpu_allocator());
  // A [B, S, 4, H, D] buffer: q, k, v and out interleaved, none overlapping.
  Tensor packed = Tensor::empty({1, p.seq, 4 * p.heads, p.head_dim}, DType::F32, cpu_allocator());
  const auto slot = [&](int s) {
    return packed.as_strided({1, p.heads, p.seq, p.head_dim}, {packed.stride(0), p.head_dim, packed.stride(1), 1},
                             s * p.heads * p.head_dim);
  };
  Inputs interleaved = in;
  interleaved.q = slot(0);
  interleaved.k = slot(1);
  interleaved.v = slot(2);
  for (int s = 0; s < 3; ++s) {
    const Tensor& src = s == 0 ? in.q : s == 1 ? in.k : in.v;
    const Tensor& dst = s == 0 ? interleaved.q : s == 1 ? interleaved.k : interleaved.v;
    testing::for_each_index(src, [&](auto a, auto b, auto c, auto d) { dst.set(a, b, c, d, src.get(a, b, c, d)); });
  }
  Tensor out_slot = slot(3);
  EXPECT_FALSE(overlaps(out_slot, interleaved.v));
  // Half a row into v's slot: a partial overlap of strided views.
  const Tensor partial = packed.as_strided(out_slot.sizes(), out_slot.strides(), 3 * p.heads * p.head_dim - 16);
  EXPECT_TRUE(overlaps(partial, interleaved.v));
  EXPECT_TRUE(overlaps(in.v, in.v.transpose(2, 3)));
  for (const char* name : kCpuBackends) {
    Backend* b = find_backend(name, Device::Cpu);
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    for (const auto& [label, out] : {std::pair<const char*, Tensor>{"v", interleaved.v},
                                     {"k", interleaved.k},
                                     {"q", interleaved.q},
                                     {"v", partial}}) {
      Tensor o = out;
      try {
        b->forward(p, interleaved, o, ctx);
        ADD_FAILURE() << name << " wrote out over " << label;
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("out shares memory with " + std::string(label)), std::string::npos) << what;
        EXPECT_EQ(what.find('\n'), std::string::npos) << what;
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      }
    }
    b->forward(p, interleaved, out_slot, ctx);  // the interleaved output runs, and right
    const ErrorStats e = check_against_reference(p, interleaved, out_slot, sample_rows(p, 1 << 20));
    EXPECT_LT(e.rel, 1e-4) << name;
  }
}

// Item 7: an output with NaN or inf where the reference has none is never
// reported as close: its relative error is NaN, whatever its finite rows say.
TEST(NumericRange, NanTheReferenceLacksMakesTheErrorNaN) {
  const Problem p = testing::to_problem(Shape{.heads = 1, .seq = 8, .head_dim = 4}, DType::F32, MaskKind::None);
  const Inputs in = make_inputs(p, 5, cpu_allocator());
  Tensor out = testing::nan_tensor(p.q_dims(), p.dtype);
  ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 100));
  EXPECT_EQ(e.nan_rows, 8);
  EXPECT_TRUE(std::isnan(e.rel)) << e.rel;
  EXPECT_FALSE(accept(p.dtype, e, std::nullopt, true).pass);
  // And a finite output where the reference is NaN (a NaN in q) is not close either.
  Inputs poisoned = in;
  poisoned.q = Tensor::empty(p.q_dims(), p.dtype, cpu_allocator());
  testing::for_each_index(in.q,
                          [&](auto a, auto b, auto c, auto d) { poisoned.q.set(a, b, c, d, in.q.get(a, b, c, d)); });
  poisoned.q.set(0, 0, 2, 1, std::numeric_limits<float>::quiet_NaN());
  Tensor zeros = Tensor::empty(p.q_dims(), p.dtype, cpu_allocator());
  testing::for_each_index(zeros, [&](auto a, auto b, auto c, auto d) { zeros.set(a, b, c, d, 0.0f); });
  e = check_against_reference(p, poisoned, zeros, sample_rows(p, 100));
  EXPECT_EQ(e.nonfinite_hidden, 4);
  EXPECT_TRUE(std::isnan(e.rel)) << e.rel;
  const Acceptance a = accept(p.dtype, e, std::nullopt, true);
  EXPECT_FALSE(a.pass);
  EXPECT_NE(a.why.find("reference is NaN"), std::string::npos) << a.why;
}

}  // namespace
}  // namespace attnprof
