// Arguments: a problem from typed values (ProblemArgs, what the Python module
// gives the library) with no number or list turned into text, each value
// checked once in the library naming its field (issue 48 item 2); the soft
// cap's and the scale's ranges, a packed batch's lengths named as themselves,
// the one limit of `top`, and the CPU's thread counts put back (issue 49
// items 10 to 14).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/problem_spec.h"
#include "attnprof/report.h"
#include "attnprof/runner.h"
#include "attnprof/thread_counts.h"

namespace attnprof {
namespace {

// `work` throws one Error(InvalidArgument) of one line naming `field` (in the
// message and in fields()), and no flag; its message.
template <class Work>
std::string refusal(std::string_view field, Work&& work) {
  try {
    work();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << what;
    EXPECT_NE(std::find(e.fields().begin(), e.fields().end(), std::string(field)), e.fields().end())
        << field << " not among the fields of: " << what;
    EXPECT_NE(what.find(field), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    EXPECT_EQ(what.find("--"), std::string::npos) << "a flag in a library message: " << what;
    return what;
  }
  ADD_FAILURE() << field << ": nothing refused";
  return {};
}

Problem valid_with(void (*change)(Problem&)) {
  Problem p;
  p.batch = 1;
  p.heads = 2;
  p.seq = 16;
  p.head_dim = 32;
  p.dtype = DType::F32;
  p.normalize();
  change(p);
  return p;
}

TEST(Arguments, TypedValuesMakeTheProblemTheTextMakes) {
  const Problem typed = problem_from_args({.batch = 3,
                                           .heads = 6,
                                           .kv_heads = 2,
                                           .seq = 40,
                                           .kv_seq = 50,
                                           .head_dim = 32,
                                           .dtype = DType::F16,
                                           .device = Device::Cpu,
                                           .mask = MaskKind::SlidingWindow,
                                           .window = 7,
                                           .scale = -0.125,
                                           .softcap = 30.0,
                                           .pass = Pass::Train,
                                           .deterministic = true});
  Problem text;
  text.batch = text.heads = 0;
  for (const auto& [field, value] :
       std::vector<std::pair<std::string_view, std::string_view>>{{"batch", "3"},
                                                                  {"heads", "6"},
                                                                  {"kv_heads", "2"},
                                                                  {"seq", "40"},
                                                                  {"kv_seq", "50"},
                                                                  {"head_dim", "32"},
                                                                  {"dtype", "fp16"},
                                                                  {"device", "cpu"},
                                                                  {"mask", "sliding_window"},
                                                                  {"window", "7"},
                                                                  {"scale", "-0.125"},
                                                                  {"softcap", "30"},
                                                                  {"pass", "train"},
                                                                  {"deterministic", "true"}}) {
    set_problem_field(text, field, value);
  }
  fill_device_defaults(text).normalize().validate();
  EXPECT_EQ(typed, text) << typed.describe() << " against " << text.describe();
  // Left unset: the device's batch and heads, and the rest of Problem's defaults.
  const Problem defaults = problem_from_args({.seq = 16, .head_dim = 16});
  EXPECT_EQ(defaults.batch, default_batch(Device::Cpu));
  EXPECT_EQ(defaults.heads, default_heads(Device::Cpu));
  EXPECT_EQ(defaults.mask, Problem{}.mask);
  EXPECT_FALSE(defaults.scale.has_value());
  EXPECT_EQ(defaults.softcap, 0.0);
}

TEST(Arguments, APackedBatchsLengthsAreAListNotText) {
  const Problem p =
      problem_from_args({.heads = 2, .head_dim = 16, .seq_lens = {{5, 0, 9}}, .kv_seq_lens = {{6, 1, 9}}});
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seq, 9);
  EXPECT_EQ(p.kv_seq, 9);
  EXPECT_EQ(p.seq_lens, (std::vector<std::int64_t>{5, 0, 9}));
  refusal("seq_lens", [] { problem_from_args({.head_dim = 16, .seq_lens = std::vector<std::int64_t>{}}); });
  refusal("seq_lens", [] { problem_from_args({.head_dim = 16, .seq_lens = {{3, -1}}}); });
  // issue 49 item 14: all 0 left seq 0 and blamed seq, which was not given.
  const std::string zeros = refusal("seq_lens", [] { problem_from_args({.head_dim = 16, .seq_lens = {{0, 0, 0}}}); });
  EXPECT_NE(zeros.find("seq_lens are all 0"), std::string::npos) << zeros;
  Problem text;
  text.batch = text.heads = 0;
  set_problem_field(text, "seq_lens", "0,0,0");
  refusal("seq_lens", [&] { fill_device_defaults(text).normalize().validate(); });
}

TEST(Arguments, AGivenValueThatReadsAsNotGivenIsRefusedByName) {
  // 0 stands for the default (a size) or for no cap: given, it is refused, not taken as that.
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{-3}}) {
    refusal("batch", [&] { problem_from_args({.batch = bad, .head_dim = 16}); });
    refusal("heads", [&] { problem_from_args({.heads = bad, .head_dim = 16}); });
    refusal("kv_heads", [&] { problem_from_args({.kv_heads = bad, .head_dim = 16}); });
    refusal("seq", [&] { problem_from_args({.seq = bad, .head_dim = 16}); });
    refusal("kv_seq", [&] { problem_from_args({.kv_seq = bad, .head_dim = 16}); });
    refusal("window", [&] { problem_from_args({.head_dim = 16, .mask = MaskKind::SlidingWindow, .window = bad}); });
    refusal("page_size", [&] { problem_from_args({.head_dim = 16, .kv_cache = KvCache::Paged, .page_size = bad}); });
  }
  for (const double cap : {0.0, -0.0, -30.0}) {
    const std::string why = refusal("softcap", [&] { problem_from_args({.head_dim = 16, .softcap = cap}); });
    EXPECT_NE(why.find("softcap must be positive"), std::string::npos) << why;
  }
  refusal("dtype", [] { dtype_from_text("fp4"); });
  refusal("device", [] { device_from_text("tpu"); });
  refusal("mask", [] { mask_from_text("diagonal"); });
  refusal("pass", [] { pass_from_text("sideways"); });
  refusal("kv_cache", [] { kv_cache_from_text("blocks"); });
}

TEST(Arguments, ASoftCapOutsideItsRangeIsRefusedByValidate) {
  // issue 49 items 1 and 2: 3.4e38 and 1e39 gave wrong values or zeros on flash, 1e-300 and 1e-46 no cap at all.
  for (const double cap : {3.4e38, 1e39, 1e300, 1e-300, 1e-46, 0x1p-61, 0x1p61, -1.0,
                           std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Problem p = valid_with([](Problem&) {});
    p.softcap = cap;
    const std::string why = refusal("softcap", [&] { p.validate(); });
    EXPECT_NE(why.find("from 2^-60 to 2^60"), std::string::npos) << why;
  }
  for (const double cap : {0x1p-60, 0x1p60, 30.0, 0.0}) {
    Problem p = valid_with([](Problem&) {});
    p.softcap = cap;
    EXPECT_NO_THROW(p.validate()) << cap;
  }
  // The same check on every path: text gives the value, validate() checks it.
  Problem text = valid_with([](Problem&) {});
  set_problem_field(text, "softcap", "1e39");
  refusal("softcap", [&] { text.validate(); });
  refusal("softcap", [] { problem_from_args({.head_dim = 16, .softcap = 1e-300}); });
}

TEST(Arguments, AScaleAFloatCannotHoldIsRefusedByName) {
  // The range every backend computes (attnprof/limits.h).
  for (const double scale : {1e-300, 1e-40, -1e-39, 0x1p-126, -0x1p-61, std::numeric_limits<double>::denorm_min()}) {
    Problem p = valid_with([](Problem&) {});
    p.scale = scale;
    const std::string why = refusal("scale", [&] { p.validate(); });
    EXPECT_NE(why.find("between 2^-60 and 2^60"), std::string::npos) << why;
  }
  for (const double scale : {0x1p-60, -0x1p-60, 0.125, -0.125}) {
    Problem p = valid_with([](Problem&) {});
    p.scale = scale;
    EXPECT_NO_THROW(p.validate()) << scale;
  }
  refusal("scale", [] { problem_from_args({.head_dim = 16, .scale = 1e-300}); });
}

TEST(Arguments, TopHasOneLimitInTheLibrary) {
  for (const std::int64_t top : {std::int64_t{0}, std::int64_t{-5}, std::int64_t{kMaxTop} + 1, std::int64_t{1} << 40}) {
    refusal("top", [&] { check_top(top); });
  }
  EXPECT_NO_THROW(check_top(1));
  EXPECT_NO_THROW(check_top(kMaxTop));
}

TEST(Arguments, TheCpuThreadCountsAreReadAndPutBack) {
  const CpuThreadCounts before = cpu_thread_counts();
  const CpuThreadCounts three{.openmp = 3, .blas = 3};
  set_cpu_thread_counts(three);
  EXPECT_EQ(cpu_thread_counts(), three);
  device_runtime(Device::Cpu, 1);  // a run's own count
  EXPECT_EQ(cpu_thread_counts(), (CpuThreadCounts{.openmp = 1, .blas = 1}));
  set_cpu_thread_counts(three);
  EXPECT_EQ(cpu_thread_counts(), three);
  set_cpu_thread_counts(before);
  EXPECT_EQ(cpu_thread_counts(), before);
}

}  // namespace
}  // namespace attnprof
