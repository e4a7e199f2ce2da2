// The CPU backends naive, naive_inplace and math against the float64
// reference, on random inputs and an output poisoned with NaN first; the ops
// and allocations their traces show; and flash's memory against naive's.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "attnprof/tensor.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Backend& backend(const std::string& name) {
  Backend* b = find_backend(name, Device::Cpu);
  if (!b) throw std::runtime_error("no CPU backend " + name);
  return *b;
}

struct Shape {
  std::int64_t batch = 1, heads = 4, kv_heads = 0, seq = 40, kv_seq = 56, head_dim = 32;
  std::int64_t window = 0;
  std::optional<double> scale;
};

Problem make_problem(Shape s, DType dt, MaskKind mask) {
  s.window = mask == MaskKind::SlidingWindow ? (s.window ? s.window : 16) : 0;
  Problem p = testing::to_problem(s, dt, mask);
  p.validate();
  return p;
}

void poison(Tensor& t) {
  testing::for_each_index(t, [&](auto b, auto h, auto i, auto d) { t.set(b, h, i, d, kNaN); });
}

// An output tensor, optionally a [B, S, H, D] buffer viewed as [B, H, S, D].
Tensor make_out(const Problem& p, bool bshd) {
  if (bshd) return Tensor::empty({p.batch, p.seq, p.heads, p.head_dim}, p.dtype, cpu_allocator()).transpose(1, 2);
  return Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, cpu_allocator());
}

// One OpenMP thread while it lives. The accuracy cases are tiny, and on a
// loaded machine libgomp's spin-waiting makes each parallel region of a
// multi-threaded team cost milliseconds; the multi-threaded paths are covered
// by the run_backend tests below.
class SingleThread {
 public:
  SingleThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThread() { omp_set_num_threads(saved_); }
  SingleThread(const SingleThread&) = delete;
  SingleThread& operator=(const SingleThread&) = delete;

 private:
  int saved_;
};

Tensor run_forward(const std::string& name, const Problem& p, const Inputs& in, bool bshd_out = false) {
  SingleThread one;
  Tensor out = make_out(p, bshd_out);
  poison(out);
  RunContext ctx{cpu_allocator(), nullptr, 1};
  backend(name).forward(p, in, out, ctx);
  return out;
}

ErrorStats check(const Problem& p, const Inputs& in, const Tensor& out) {
  return check_against_reference(p, in, out, sample_rows(p, std::int64_t{1} << 40));
}

// The backend's error, judged by DESIGN.md's rule with math's error on the same inputs.
void expect_accurate(const std::string& name, const Problem& p, const Inputs& in, bool bshd_out = false) {
  const Tensor out = run_forward(name, p, in, bshd_out);
  const ErrorStats e = check(p, in, out);
  ASSERT_EQ(e.rows_checked, p.batch * p.heads * p.seq);
  EXPECT_EQ(e.nan_count, 0) << name << " left NaN (unwritten or wrong) on " << p.describe();
  std::optional<double> math_rel;
  if (is_16bit(p.dtype)) {
    const ErrorStats m = check(p, in, run_forward("math", p, in));
    ASSERT_EQ(m.nan_count, 0);
    math_rel = m.rel;
  }
  const Acceptance a = accept(p.dtype, e, math_rel, false);
  EXPECT_TRUE(a.pass) << name << " on " << p.describe() << ": " << a.why;
  // Whatever the rule says, the answer must be close in absolute terms too.
  EXPECT_LT(e.rel, p.dtype == DType::F32 ? 1e-5 : (p.dtype == DType::F16 ? 5e-3 : 3e-2)) << name << " " << p.describe();
}

using AccuracyParam = std::tuple<std::string, DType, MaskKind>;
class Accuracy : public ::testing::TestWithParam<AccuracyParam> {};

TEST_P(Accuracy, MatchesFloat64Reference) {
  const auto& [name, dt, mask] = GetParam();
  const Problem p = make_problem(Shape{}, dt, mask);  // kv_seq 56 != seq 40
  ASSERT_EQ(p.fully_masked_rows(), 0);
  const Inputs in = make_inputs(p, 17, cpu_allocator());
  expect_accurate(name, p, in);
}

std::string accuracy_name(const ::testing::TestParamInfo<AccuracyParam>& info) {
  std::string mask(mask_name(std::get<2>(info.param)));
  std::replace(mask.begin(), mask.end(), '-', '_');
  return std::get<0>(info.param) + "_" + std::string(dtype_name(std::get<1>(info.param))) + "_" + mask;
}

INSTANTIATE_TEST_SUITE_P(CpuBackends, Accuracy,
                         ::testing::Combine(::testing::Values("naive", "naive_inplace", "math"),
                                            ::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::Values(MaskKind::None, MaskKind::Causal,
                                                              MaskKind::CausalBottomRight, MaskKind::SlidingWindow,
                                                              MaskKind::Boolean, MaskKind::Bias)),
                         accuracy_name);

struct Variant {
  const char* label;
  Shape shape;
  MaskKind mask;
  DType dtype;
  bool bshd_in = false;
  bool bshd_out = false;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.label; }

class Variants : public ::testing::TestWithParam<std::tuple<std::string, Variant>> {};

TEST_P(Variants, MatchesFloat64Reference) {
  const auto& [name, v] = GetParam();
  const Problem p = make_problem(v.shape, v.dtype, v.mask);
  ASSERT_EQ(p.fully_masked_rows(), 0);
  const Inputs in = make_inputs(p, 23, cpu_allocator(), v.bshd_in);
  if (v.bshd_in) ASSERT_FALSE(in.q.is_contiguous());
  expect_accurate(name, p, in, v.bshd_out);
}

const Variant kVariants[] = {
    {"gqa", {.heads = 4, .kv_heads = 2}, MaskKind::Causal, DType::BF16},
    {"mqa", {.heads = 4, .kv_heads = 1, .seq = 33, .kv_seq = 33}, MaskKind::CausalBottomRight, DType::F32},
    {"gqa_bias", {.batch = 2, .heads = 6, .kv_heads = 3}, MaskKind::Bias, DType::F16},
    {"kv_shorter", {.seq = 50, .kv_seq = 30}, MaskKind::Causal, DType::F32},  // top-left: no masked rows
    {"kv_shorter_none", {.seq = 50, .kv_seq = 30}, MaskKind::None, DType::BF16},
    {"bshd_in", {.batch = 2, .heads = 4, .kv_heads = 2}, MaskKind::Causal, DType::BF16, true},
    {"bshd_in_fp32", {.batch = 2}, MaskKind::SlidingWindow, DType::F32, true},
    {"bshd_in_out", {.heads = 2}, MaskKind::Boolean, DType::F16, true, true},
    {"bshd_out", {.heads = 2}, MaskKind::Causal, DType::F32, false, true},
    {"custom_scale", {.scale = 0.3}, MaskKind::Causal, DType::F32},
    {"head_dim_256", {.heads = 2, .seq = 24, .kv_seq = 24, .head_dim = 256}, MaskKind::Causal, DType::BF16},
    {"head_dim_odd", {.heads = 2, .seq = 17, .kv_seq = 19, .head_dim = 5}, MaskKind::None, DType::F32},
    {"window_1", {.seq = 20, .kv_seq = 20, .window = 1}, MaskKind::SlidingWindow, DType::F32},
};

INSTANTIATE_TEST_SUITE_P(CpuBackends, Variants,
                         ::testing::Combine(::testing::Values("naive", "naive_inplace", "math"),
                                            ::testing::ValuesIn(kVariants)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param).label;
                         });

// Rows [0, masked) of every (batch, head) of `out` hold `masked_value` (a NaN
// there: any NaN), the others are finite. A failure ends the visit: callers
// wrap it in ASSERT_NO_FATAL_FAILURE.
void expect_masked_rows(const std::string& name, const Tensor& out, std::int64_t masked, float masked_value) {
  for (std::int64_t b = 0; b < out.size(0); ++b)
    for (std::int64_t h = 0; h < out.size(1); ++h)
      for (std::int64_t i = 0; i < out.size(2); ++i)
        for (std::int64_t d = 0; d < out.size(3); ++d) {
          const float x = out.get(b, h, i, d);
          if (i >= masked) {
            ASSERT_TRUE(std::isfinite(x)) << name << " row " << i << " col " << d;
          } else if (std::isnan(masked_value)) {
            ASSERT_TRUE(std::isnan(x)) << name << " row " << i << " should be NaN";
          } else {
            ASSERT_EQ(x, masked_value) << name << " row " << i;
          }
        }
}

// Bottom-right causal with kv_seq < seq: the first seq - kv_seq rows see no key.
class FullyMasked : public ::testing::TestWithParam<DType> {};

TEST_P(FullyMasked, NaiveGivesNanExactlyThereMathGivesZeros) {
  const Problem p =
      make_problem({.batch = 2, .heads = 2, .seq = 48, .kv_seq = 32}, GetParam(), MaskKind::CausalBottomRight);
  const std::int64_t masked = p.seq - p.kv_seq;
  ASSERT_EQ(p.fully_masked_rows(), masked);
  const Inputs in = make_inputs(p, 5, cpu_allocator());
  for (const std::string name : {"naive", "naive_inplace"}) {
    const Tensor out = run_forward(name, p, in);
    ASSERT_NO_FATAL_FAILURE(expect_masked_rows(name, out, masked, kNaN));
    const ErrorStats e = check(p, in, out);
    EXPECT_EQ(e.nan_rows, p.batch * p.heads * masked);
    EXPECT_EQ(e.nan_rows_fully_masked, e.nan_rows);
    EXPECT_TRUE(accept(p.dtype, e, std::nullopt, true).pass);
    EXPECT_FALSE(accept(p.dtype, e, std::nullopt, false).pass);
  }
  const Tensor out = run_forward("math", p, in);
  ASSERT_NO_FATAL_FAILURE(expect_masked_rows("math", out, masked, 0.0f));
  const ErrorStats e = check(p, in, out);
  EXPECT_EQ(e.nan_rows, 0);
  EXPECT_TRUE(accept(p.dtype, e, e.rel, false).pass);
}

INSTANTIATE_TEST_SUITE_P(CpuBackends, FullyMasked, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---------------------------------------------------------------- traces

const Activity* forward_range(const Trace& t, int k = 0) {
  int n = 0;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::UserAnnotation && a.name == "forward" && n++ == k) return &a;
  }
  return nullptr;
}

bool inside(const Activity& outer, const Activity& inner) {
  return inner.tid == outer.tid && inner.start_ns >= outer.start_ns && inner.end_ns() <= outer.end_ns();
}

// CPU ops directly inside a range (one level down).
std::vector<const Activity*> children(const Trace& t, const Activity& parent) {
  std::vector<const Activity*> out;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::CpuOp && a.depth == parent.depth + 1 && inside(parent, a) && &a != &parent) {
      out.push_back(&a);
    }
  }
  return out;
}

std::vector<std::string> names(const std::vector<const Activity*>& v) {
  std::vector<std::string> n;
  for (const Activity* a : v) n.push_back(a->name);
  return n;
}

std::vector<const Activity*> allocations_in(const Trace& t, const Activity& range) {
  std::vector<const Activity*> out;
  for (const auto& a : t.activities) {
    if (a.type == ActivityType::Allocation && a.start_ns >= range.start_ns && a.start_ns <= range.end_ns()) {
      out.push_back(&a);
    }
  }
  return out;
}

int count_named(const Trace& t, const std::string& name) {
  return static_cast<int>(std::count_if(t.activities.begin(), t.activities.end(), [&](const Activity& a) {
    return a.type == ActivityType::CpuOp && a.name == name;
  }));
}

// Most trace tests run on one thread (see SingleThread); RunBackendWithBshdInputs
// and the memory test use every core.
RunOptions quick(int active = 2, int threads = 1) {
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = active, .repeat = 1};
  o.check_rows = 256;
  o.threads = threads;
  return o;
}

TEST(CpuTraces, NaiveOutOfPlaceFillMakesANestedCopyAndAllocates) {
  const Problem p = make_problem({.heads = 2, .seq = 128, .kv_seq = 128}, DType::BF16, MaskKind::Causal);
  const RunResult r = run_backend(backend("naive"), p, quick());
  ASSERT_FALSE(r.failure) << *r.failure;
  ASSERT_TRUE(r.acceptance && r.acceptance->pass) << (r.acceptance ? r.acceptance->why : "no check");
  EXPECT_EQ(r.trace.steps_recorded, 2);
  EXPECT_EQ(r.metrics.steps, 2);
  const std::vector<std::string> want = {"matmul", "mul", "masked_fill", "softmax", "matmul"};
  for (int k = 0; k < 2; ++k) {
    const Activity* fwd = forward_range(r.trace, k);
    ASSERT_NE(fwd, nullptr);
    const auto ops = children(r.trace, *fwd);
    ASSERT_EQ(names(ops), want) << "forward " << k;
    const Activity* fill = ops[2];
    const auto nested = children(r.trace, *fill);
    const auto nested_names = names(nested);
    EXPECT_NE(std::find(nested_names.begin(), nested_names.end(), "copy_"), nested_names.end())
        << "no copy_ inside masked_fill";
    // The out-of-place fill allocates a whole score tensor.
    const std::int64_t scores = p.batch * p.heads * p.seq * p.kv_seq * 2;
    std::int64_t in_fill = 0;
    for (const Activity* a : allocations_in(r.trace, *fill)) {
      if (a->allocation->bytes > 0) in_fill += a->allocation->bytes;
    }
    EXPECT_GE(in_fill, scores);
    const auto allocs = allocations_in(r.trace, *fwd);
    EXPECT_GE(allocs.size(), 4u);
    for (const Activity* a : allocs) {
      ASSERT_TRUE(a->allocation.has_value());
      EXPECT_NE(a->allocation->bytes, 0);
      EXPECT_GE(a->allocation->peak_allocated, a->allocation->total_allocated);
    }
  }
  EXPECT_EQ(count_named(r.trace, "copy_"), 2);
  EXPECT_DOUBLE_EQ(r.metrics.copies_per_forward, 1.0);
  EXPECT_DOUBLE_EQ(r.metrics.ops_per_forward, 5.0);
  EXPECT_EQ(r.expectation.cpu_ops, want);
  EXPECT_EQ(r.expectation.copies, 1);
  EXPECT_GT(r.metrics.peak_bytes, 0);
  EXPECT_GT(r.metrics.allocated_bytes_per_forward, 0);
  EXPECT_FALSE(r.metrics.kernels_per_forward.has_value());  // no GPU activities on the CPU
}

TEST(CpuTraces, NaiveInplaceHasNoCopyAndAllocatesLess) {
  const Problem p = make_problem({.heads = 2, .seq = 128, .kv_seq = 128}, DType::BF16, MaskKind::Causal);
  const RunResult naive = run_backend(backend("naive"), p, quick());
  const RunResult r = run_backend(backend("naive_inplace"), p, quick());
  ASSERT_FALSE(r.failure) << *r.failure;
  ASSERT_FALSE(naive.failure) << *naive.failure;
  const Activity* fwd = forward_range(r.trace);
  ASSERT_NE(fwd, nullptr);
  const auto ops = children(r.trace, *fwd);
  EXPECT_EQ(names(ops), (std::vector<std::string>{"matmul", "mul", "masked_fill_", "softmax", "matmul"}));
  EXPECT_EQ(count_named(r.trace, "copy_"), 0);
  EXPECT_EQ(count_named(r.trace, "masked_fill"), 0);
  EXPECT_DOUBLE_EQ(r.metrics.copies_per_forward, 0.0);
  ASSERT_EQ(ops.size(), 5u);
  for (const Activity* a : allocations_in(r.trace, *ops[2])) {
    EXPECT_LE(a->allocation->bytes, 0) << "masked_fill_ allocated";
  }
  // One score tensor less per forward than naive.
  const double saved = naive.metrics.allocated_bytes_per_forward - r.metrics.allocated_bytes_per_forward;
  EXPECT_GE(saved, static_cast<double>(p.batch * p.heads * p.seq * p.kv_seq * 2));
  EXPECT_LE(r.metrics.peak_bytes, naive.metrics.peak_bytes);
}

TEST(CpuTraces, MathUpcastsRebuildsTheMaskAndUsesSafeSoftmax) {
  const Problem p = make_problem({.heads = 2, .seq = 96, .kv_seq = 96}, DType::BF16, MaskKind::Causal);
  const RunResult r = run_backend(backend("math"), p, quick());
  ASSERT_FALSE(r.failure) << *r.failure;
  const Activity* fwd = forward_range(r.trace);
  ASSERT_NE(fwd, nullptr);
  const auto ops = names(children(r.trace, *fwd));
  for (const char* want : {"to", "ones", "tril", "where", "mul", "matmul", "add_", "_safe_softmax"}) {
    EXPECT_NE(std::find(ops.begin(), ops.end(), want), ops.end()) << want << " missing from math's ops";
  }
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "to"), 4);  // q, k, v up and the output down
  EXPECT_EQ(std::find(ops.begin(), ops.end(), "softmax"), ops.end());
  EXPECT_EQ(ops, r.expectation.cpu_ops);
  // The mask is rebuilt on every recorded call, not cached.
  EXPECT_EQ(count_named(r.trace, "tril"), 2);
  EXPECT_EQ(count_named(r.trace, "ones"), 2);
  // The products run in FP32 on 16-bit inputs.
  for (const auto& a : r.trace.activities) {
    if (a.type == ActivityType::CpuOp && a.name == "matmul")
      EXPECT_EQ(a.input_dtypes.rfind("fp32", 0), 0u) << a.input_dtypes;
  }
  ASSERT_TRUE(r.acceptance.has_value());
  EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why;
}

TEST(CpuTraces, ObservedOpsMatchEachBackendsExpectation) {
  // "Guess first, then look": the declared op sequence is what the trace shows.
  for (const std::string name : {"naive", "naive_inplace", "math"}) {
    for (MaskKind mask :
         {MaskKind::None, MaskKind::Causal, MaskKind::SlidingWindow, MaskKind::Boolean, MaskKind::Bias}) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const Problem p = make_problem({.heads = 2, .seq = 32, .kv_seq = 48}, dt, mask);
        const RunResult r = run_backend(backend(name), p, quick(1));
        ASSERT_FALSE(r.failure) << *r.failure;
        const Activity* fwd = forward_range(r.trace);
        ASSERT_NE(fwd, nullptr);
        const auto ops = names(children(r.trace, *fwd));
        EXPECT_EQ(ops, r.expectation.cpu_ops) << name << " " << p.describe();
        EXPECT_DOUBLE_EQ(r.metrics.ops_per_forward, static_cast<double>(ops.size()));
        EXPECT_DOUBLE_EQ(r.metrics.copies_per_forward, r.expectation.copies) << name << " " << p.describe();
        ASSERT_TRUE(r.acceptance.has_value());
        EXPECT_TRUE(r.acceptance->pass) << name << " " << p.describe() << ": " << r.acceptance->why;
      }
    }
  }
}

TEST(CpuTraces, RunBackendWithBshdInputs) {
  const Problem p = make_problem({.batch = 2, .heads = 4, .kv_heads = 2}, DType::F16, MaskKind::Causal);
  RunOptions o = quick(1, 0);
  o.bshd_inputs = true;
  for (const std::string name : {"naive", "naive_inplace", "math", "flash"}) {
    const RunResult r = run_backend(backend(name), p, o);
    ASSERT_FALSE(r.failure) << *r.failure;
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->nan_count, 0) << name;
    EXPECT_LT(r.error->rel, 5e-3) << name;
  }
}

TEST(CpuTraces, RefusesAProblemTooLargeBeforeAllocating) {
  const Problem p = make_problem({.batch = 4096, .heads = 64, .seq = 65536, .kv_seq = 65536, .head_dim = 64},
                                 DType::BF16, MaskKind::Causal);
  const std::int64_t before = cpu_allocator().stats().allocated;
  cpu_allocator().reset_peak();
  for (const std::string name : {"naive", "flash"}) {
    const RunResult r = run_backend(backend(name), p, quick());
    ASSERT_TRUE(r.failure.has_value()) << name;
    EXPECT_NE(r.failure->find("GiB"), std::string::npos) << *r.failure;
    EXPECT_NE(r.failure->find("smaller batch"), std::string::npos) << *r.failure;
    EXPECT_EQ(r.metrics.steps, 0);
  }
  EXPECT_LT(cpu_allocator().stats().peak_allocated - before, 1 << 20);
}

// ---------------------------------------------------------------- memory

std::int64_t peak_of(const std::string& name, std::int64_t seq) {
  const Problem p =
      make_problem({.heads = 2, .seq = seq, .kv_seq = seq, .head_dim = 64}, DType::BF16, MaskKind::Causal);
  RunOptions o = quick(1);
  o.check_rows = 32;
  const RunResult r = run_backend(backend(name), p, o);
  if (r.failure) ADD_FAILURE() << name << ": " << *r.failure;
  return r.metrics.peak_bytes;
}

TEST(CpuMemory, FlashPeakFarBelowNaiveAndGrowsAtMostLinearly) {
  const std::int64_t naive_1024 = peak_of("naive", 1024);
  const std::int64_t flash_1024 = peak_of("flash", 1024);
  const std::int64_t scores = 2 * 1024 * 1024 * 2;  // one bf16 [1, 2, 1024, 1024] tensor
  EXPECT_GE(naive_1024, 2 * scores) << "naive holds at least two score tensors at once";
  EXPECT_GT(flash_1024, 0);
  EXPECT_LT(flash_1024 * 8, naive_1024) << "flash " << flash_1024 << " vs naive " << naive_1024;
  EXPECT_LT(flash_1024, scores / 4) << "flash must not materialise [S, S]";

  const double naive_growth = static_cast<double>(peak_of("naive", 512)) / static_cast<double>(peak_of("naive", 256));
  const double flash_growth = static_cast<double>(peak_of("flash", 512)) / static_cast<double>(peak_of("flash", 256));
  EXPECT_GT(naive_growth, 3.5);
  EXPECT_LT(naive_growth, 4.5);
  EXPECT_LE(flash_growth, 2.2);
  EXPECT_GT(flash_growth, 0.5);
}

}  // namespace
}  // namespace attnprof
