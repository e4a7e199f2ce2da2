// The paged KV cache on CUDA (--kv-cache paged --page-size N): naive,
// naive_inplace and math gather the pages with one kernel per tensor
// (index_select), cudnn reads them in place through cuDNN's paged SDPA.
// Decode shapes (1, 4 and 16 queries against 300 keys, not a multiple of
// either page size; 8 query heads over 2 KV heads) against the float64
// reference, which reads the logical K and V; the composites' paged output
// against their contiguous one, bit for bit (the gather is a copy); the
// expected op list and kernel count against CUPTI; a table that maps the
// wrong pages gives wrong answers; and a backward through the cache is
// refused in one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/composite/composite.h"
#include "backends/cuda/cuda_backends.h"
#include "common/test_problem.h"
#include "cuda_forward.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

constexpr auto& make = testing::make_cuda_backend;
constexpr auto& run_once = testing::run_forward_once;

const char* const kBackends[] = {"naive", "naive_inplace", "math", "cudnn"};
bool composite_backend(const std::string& name) { return name != "cudnn"; }

Problem paged(testing::Shape s, std::int64_t page, MaskKind mask, DType dtype) {
  Problem p = testing::to_problem(s, dtype, mask, Device::Cuda);
  p.kv_cache = KvCache::Paged;
  p.page_size = page;
  p.validate();
  return p;
}

Problem contiguous(Problem p) {
  p.kv_cache = KvCache::Contiguous;
  p.page_size = 0;
  return p;
}

// Largest |a - b| over two host outputs of one shape (NaN if either has one).
double max_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  testing::for_each_index(a, [&](std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) {
    const double d = std::fabs(static_cast<double>(a.get(i, j, k, l)) - static_cast<double>(b.get(i, j, k, l)));
    worst = std::isnan(d) || std::isnan(worst) ? NAN : std::max(worst, d);
  });
  return worst;
}

struct Case {
  std::int64_t seq, page;
  MaskKind mask;
  DType dtype;
};

std::string label(const Case& c) {
  return "seq" + std::to_string(c.seq) + "_page" + std::to_string(c.page) + "_" +
         (c.mask == MaskKind::None ? "none" : "causal_br") + "_" + std::string(dtype_name(c.dtype));
}

void PrintTo(const Case& c, std::ostream* os) { *os << label(c); }

std::vector<Case> cases() {
  std::vector<Case> out;
  for (std::int64_t seq : {1, 4, 16}) {
    for (std::int64_t page : {16, 64}) {
      for (MaskKind mask : {MaskKind::CausalBottomRight, MaskKind::None}) {
        for (DType dtype : {DType::BF16, DType::F16}) out.push_back({seq, page, mask, dtype});
      }
    }
  }
  return out;
}

// The decode shape of a case: 2 sequences, 8 query heads over 2 KV heads,
// 300 keys in 19 pages of 16 or 5 of 64 (the last one padded).
Problem problem_of(const Case& c) {
  return paged({.batch = 2, .heads = 8, .kv_heads = 2, .seq = c.seq, .kv_seq = 300, .head_dim = 64}, c.page, c.mask,
               c.dtype);
}

class PagedCudaDecode : public ::testing::TestWithParam<Case> {};

TEST_P(PagedCudaDecode, MatchesFloat64AndTheContiguousCache) {
  REQUIRE_GPU();
  const Problem p = problem_of(GetParam());
  const Inputs host = make_inputs(p, 0x9a9e + p.seq, cpu_allocator());
  const RowSample rows = sample_rows(p, 1 << 20);
  std::optional<double> math_rel;
  {
    auto math = make("math");
    ASSERT_TRUE(math->eligibility(p).eligible) << math->eligibility(p).reason;
    math_rel = check_against_reference(p, host, run_once(*math, p, host), rows).rel;
  }
  for (const std::string name : kBackends) {
    SCOPED_TRACE(name + " on " + p.describe());
    auto b = make(name);
    const Eligibility el = b->eligibility(p);
    ASSERT_TRUE(el.eligible) << el.reason;
    EXPECT_NE(el.reason.find(std::to_string(p.page_size) + "-key pages"), std::string::npos) << el.reason;
    const Tensor out = run_once(*b, p, host);
    const ErrorStats e = check_against_reference(p, host, out, rows);
    const Acceptance a = accept(p.dtype, e, name == "math" ? std::nullopt : math_rel, false);
    EXPECT_TRUE(a.pass) << a.why << ", max abs " << e.max_abs << ", NaN rows " << e.nan_rows;
    EXPECT_EQ(e.nan_count, 0);
    EXPECT_EQ(e.rows_checked, p.batch * p.heads * p.seq);
    if (composite_backend(name)) {
      // The gather copies the keys; the same ops on the same values give the same bits.
      const Tensor flat = run_once(*make(name), contiguous(p), host);
      EXPECT_EQ(max_diff(out, flat), 0.0) << "paged and contiguous outputs differ";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, PagedCudaDecode, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return label(info.param); });

// "Guess first, then look": the composites' trace opens with the two gathers
// and counts their two kernels; cudnn's paged graph is still one kernel.
TEST(PagedCuda, OpsAndKernelCountsMatchExpectation) {
  REQUIRE_GPU();
  const Problem p = paged({.batch = 2, .heads = 8, .kv_heads = 2, .seq = 4, .kv_seq = 300, .head_dim = 64}, 16,
                          MaskKind::CausalBottomRight, DType::BF16);
  for (const std::string name : kBackends) {
    SCOPED_TRACE(name);
    auto b = make(name);
    ASSERT_TRUE(b->eligibility(p).eligible) << b->eligibility(p).reason;
    RunOptions o;
    o.schedule = Schedule{.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
    o.unprofiled_calls = 0;
    const RunResult r = run_backend(*b, p, o);
    ASSERT_FALSE(r.failure) << *r.failure;
    ASSERT_TRUE(r.acceptance) << "no float64 check";
    EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why;
    if (composite_backend(name)) {
      ASSERT_GE(r.expectation.cpu_ops.size(), 2u);
      EXPECT_EQ(r.expectation.cpu_ops[0], "index_select");
      EXPECT_EQ(r.expectation.cpu_ops[1], "index_select");
      EXPECT_EQ(r.expectation.device_activities, b->expectation(contiguous(p)).device_activities + 2);
      const analysis::TraceIndex index(r.trace);
      ASSERT_FALSE(index.forwards().empty());
      for (std::size_t f = 0; f < index.forwards().size(); ++f) {
        std::vector<std::string> ops;
        for (const analysis::EventIndex a : index.forward_ops(f)) ops.emplace_back(index.op(a));
        EXPECT_EQ(ops, r.expectation.cpu_ops);
      }
    }
    if (!r.metrics.kernels_per_forward) GTEST_SKIP() << "no CUPTI activities: cannot count kernels";
    // Libraries may zero a workspace with a memset before their kernel; the
    // expectation is held to kernels and copies (as cuda_backends_test does).
    EXPECT_EQ(*r.metrics.kernels_per_forward - r.metrics.memsets_per_forward, r.expectation.device_activities);
    EXPECT_EQ(r.metrics.copies_per_forward, r.expectation.copies);
  }
}

// A table that maps the wrong pages must give wrong answers, or the checks
// above prove nothing: the two sequences trade their first pages (still a
// valid table, every page once), which every query of a bottom-right causal
// decode sees. The outputs change, and the float64 check (which reads the
// logical K and V) fails.
TEST(PagedCuda, AWrongTableGivesWrongAnswers) {
  REQUIRE_GPU();
  const Problem p = paged({.batch = 2, .heads = 8, .kv_heads = 2, .seq = 4, .kv_seq = 300, .head_dim = 64}, 16,
                          MaskKind::CausalBottomRight, DType::BF16);
  const Inputs host = make_inputs(p, 0x7ab1e, cpu_allocator());
  Inputs swapped = host;
  swapped.block_table = Tensor::empty(host.block_table.sizes(), DType::I32, cpu_allocator());
  std::memcpy(swapped.block_table.data(), host.block_table.data(), host.block_table.nbytes());
  auto* ids = swapped.block_table.data_as<std::int32_t>();
  std::swap(ids[0], ids[p.pages_per_seq()]);
  check_block_table(p, swapped.block_table, swapped.k_pages.size(0));
  const RowSample rows = sample_rows(p, 1 << 20);
  for (const std::string name : kBackends) {
    SCOPED_TRACE(name);
    auto b = make(name);
    ASSERT_TRUE(b->eligibility(p).eligible) << b->eligibility(p).reason;
    const Tensor right = run_once(*b, p, host);
    const Tensor wrong = run_once(*b, p, swapped);
    EXPECT_GT(max_diff(right, wrong), 1e-2) << "the output did not follow the table";
    const ErrorStats e = check_against_reference(p, host, wrong, rows);
    EXPECT_GT(e.rel, 1e-2) << "a swapped table went unnoticed";
  }
}

// The gather cannot refuse a table it only reads on the device (ops.h): an
// entry past the cache gives NaN rows instead of a read outside it, and the
// float64 check fails. (cuDNN reads the table as given: make_inputs checks
// every table on the host, so it is not handed one here.)
TEST(PagedCuda, GatherWritesNaNForAnEntryPastTheCache) {
  REQUIRE_GPU();
  const Problem p = paged({.batch = 2, .heads = 8, .kv_heads = 2, .seq = 4, .kv_seq = 300, .head_dim = 64}, 16,
                          MaskKind::CausalBottomRight, DType::BF16);
  Inputs host = make_inputs(p, 0xbad, cpu_allocator());
  Tensor table = Tensor::empty(host.block_table.sizes(), DType::I32, cpu_allocator());
  std::memcpy(table.data(), host.block_table.data(), host.block_table.nbytes());
  table.data_as<std::int32_t>()[3] = 100000;
  host.block_table = table;
  for (const std::string name : {"naive", "math"}) {
    SCOPED_TRACE(name);
    const Tensor out = run_once(*make(name), p, host);
    const ErrorStats e = check_against_reference(p, host, out, sample_rows(p, 1 << 20));
    EXPECT_GT(e.nan_rows, 0) << "an entry past the cache went unnoticed";
    EXPECT_FALSE(accept(p.dtype, e, std::nullopt, false).pass);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the gather read outside the cache";
}

// Paged is forward only: a backward or training pass through the cache is
// refused with one line by every backend that reads pages here (before any
// device call, so this needs no GPU).
TEST(PagedCuda, BackwardIsRefusedInOneLine) {
  Problem p = paged({.batch = 1, .heads = 8, .kv_heads = 2, .seq = 4, .kv_seq = 300, .head_dim = 64}, 16,
                    MaskKind::CausalBottomRight, DType::BF16);
  for (const Pass pass : {Pass::Backward, Pass::Train}) {
    p.pass = pass;
    for (const std::string name : kBackends) {
      SCOPED_TRACE(name + " " + std::string(pass_name(pass)));
      auto b = make(name);
      const Eligibility el = eligibility_of(*b, p);
      if (el.reason.find("not built with cuDNN") != std::string::npos) continue;
      EXPECT_FALSE(el.eligible);
      EXPECT_NE(el.reason.find("forward only"), std::string::npos) << el.reason;
      EXPECT_EQ(el.reason.find('\n'), std::string::npos) << el.reason;
    }
  }
}

}  // namespace
}  // namespace attnprof
