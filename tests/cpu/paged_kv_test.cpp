// The paged KV cache on the CPU (--kv-cache paged --page-size N): K and V in
// pages [num_pages, Hkv, page, D] read through a shuffled block table. The
// composites gather the pages (index_select) and CPU flash reads them in
// place; both pass against the float64 reference, which reads the logical
// K and V. A corrupted table is refused with one line, and so are the flags
// the CLI does not take.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/composite/composite.h"
#include "backends/composite/composite_backend.h"
#include "backends/composite/plan.h"
#include "common/cli_run.h"
#include "common/temp_dir.h"
#include "common/test_problem.h"
#include "parallel/sharding.h"
#include "report/json.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof {
namespace {

Backend& backend(const std::string& name) {
  Backend* b = find_backend(name, Device::Cpu);
  if (!b) throw std::runtime_error("no CPU backend " + name);
  return *b;
}

RunOptions quick() {
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 1, .repeat = 1};
  o.check_rows = 256;
  o.threads = 1;
  return o;
}

Problem paged(testing::Shape s, std::int64_t page, MaskKind mask, DType dtype = DType::BF16) {
  Problem p = testing::to_problem(s, dtype, mask);
  p.kv_cache = KvCache::Paged;
  p.page_size = page;
  p.validate();
  return p;
}

struct Case {
  const char* label;
  testing::Shape shape;
  std::int64_t page;
  MaskKind mask;
  DType dtype;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

// The backends that read a paged cache on the CPU.
const char* const kBackends[] = {"naive", "naive_inplace", "math", "flash"};

class PagedPasses : public ::testing::TestWithParam<Case> {};

TEST_P(PagedPasses, AgainstFloat64) {
  const Case& c = GetParam();
  const Problem p = paged(c.shape, c.page, c.mask, c.dtype);
  for (const char* name : kBackends) {
    SCOPED_TRACE(name);
    const Eligibility el = eligibility_of(backend(name), p);
    ASSERT_TRUE(el.eligible) << el.reason;
    const RunResult r = run_backend(backend(name), p, quick());
    ASSERT_FALSE(r.failure) << *r.failure;
    ASSERT_TRUE(r.acceptance) << "no float64 check";
    EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why << " (" << p.describe() << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, PagedPasses,
                         ::testing::Values(
                             // kv_seq 100 is not a multiple of 16 or 64: the last page is padded.
                             Case{"page16_causal",
                                  {.batch = 2, .heads = 2, .seq = 100, .kv_seq = 100, .head_dim = 32},
                                  16,
                                  MaskKind::Causal,
                                  DType::BF16},
                             Case{"page64_none_fp32",
                                  {.batch = 2, .heads = 2, .seq = 40, .kv_seq = 100, .head_dim = 32},
                                  64,
                                  MaskKind::None,
                                  DType::F32},
                             Case{"page16_gqa",
                                  {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 48, .kv_seq = 70, .head_dim = 64},
                                  16,
                                  MaskKind::Causal,
                                  DType::F16},
                             Case{"page64_gqa_mqa",
                                  {.batch = 3, .heads = 4, .kv_heads = 1, .seq = 32, .kv_seq = 130, .head_dim = 32},
                                  64,
                                  MaskKind::Causal,
                                  DType::BF16},
                             // The decode-like shapes: a few queries against a long cache.
                             Case{"decode_seq1",
                                  {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 1, .kv_seq = 300, .head_dim = 64},
                                  16,
                                  MaskKind::CausalBottomRight,
                                  DType::BF16},
                             Case{"decode_seq16",
                                  {.batch = 2, .heads = 4, .kv_heads = 1, .seq = 16, .kv_seq = 300, .head_dim = 64},
                                  64,
                                  MaskKind::CausalBottomRight,
                                  DType::BF16},
                             Case{"decode_seq7_page16",
                                  {.batch = 1, .heads = 2, .seq = 7, .kv_seq = 300, .head_dim = 32},
                                  16,
                                  MaskKind::CausalBottomRight,
                                  DType::F32},
                             // A page larger than the whole cache: one padded page per sequence.
                             Case{"page_larger_than_cache",
                                  {.batch = 2, .heads = 2, .seq = 20, .kv_seq = 20, .head_dim = 32},
                                  64,
                                  MaskKind::Causal,
                                  DType::BF16}),
                         [](const auto& info) { return std::string(info.param.label); });

// Every decode-like width of 1 .. 16 queries against a 300-key cache (not a
// multiple of either page size), grouped-query, bottom-right causal.
TEST(PagedDecode, EveryQueryCountFrom1To16) {
  for (std::int64_t seq = 1; seq <= 16; ++seq) {
    const std::int64_t page = seq % 2 == 0 ? 64 : 16;
    const Problem p = paged({.batch = 2, .heads = 4, .kv_heads = 2, .seq = seq, .kv_seq = 300, .head_dim = 32}, page,
                            MaskKind::CausalBottomRight);
    for (const char* name : kBackends) {
      SCOPED_TRACE(std::string(name) + " seq " + std::to_string(seq));
      const RunResult r = run_backend(backend(name), p, quick());
      ASSERT_FALSE(r.failure) << *r.failure;
      ASSERT_TRUE(r.acceptance) << "no float64 check";
      EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why;
    }
  }
}

TEST(PagedInputs, PagesHoldTheLogicalKeysThroughTheTable) {
  const Problem p = paged({.batch = 2, .heads = 2, .seq = 8, .kv_seq = 37, .head_dim = 8}, 16, MaskKind::Causal);
  const Inputs in = make_inputs(p, 7, cpu_allocator());
  ASSERT_EQ(p.pages_per_seq(), 3);
  ASSERT_EQ(in.block_table.sizes(), (Dims{1, 1, 2, 3}));
  ASSERT_EQ(in.k_pages.sizes(), (Dims{6, 2, 16, 8}));
  bool shuffled = false;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t l = 0; l < 3; ++l) {
      const auto phys = static_cast<std::int64_t>(in.block_table.get(0, 0, b, l));
      shuffled |= phys != b * 3 + l;
      for (std::int64_t hk = 0; hk < p.kv_heads; ++hk) {
        for (std::int64_t r = 0; r < 16 && l * 16 + r < p.kv_seq; ++r) {
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            ASSERT_EQ(in.k_pages.get(phys, hk, r, d), in.k.get(b, hk, l * 16 + r, d));
            ASSERT_EQ(in.v_pages.get(phys, hk, r, d), in.v.get(b, hk, l * 16 + r, d));
          }
        }
      }
    }
  }
  EXPECT_TRUE(shuffled) << "the physical pages should not be in logical order";
  EXPECT_EQ(2 * p.kv_page_bytes(), in.k_pages.nbytes() + in.v_pages.nbytes() + in.block_table.nbytes());
  EXPECT_NE(p.describe().find("paged KV cache (3 pages of 16 keys"), std::string::npos) << p.describe();
}

// A table that maps the wrong pages must give wrong answers: the check is not vacuous.
TEST(PagedInputs, AWrongTableGivesWrongAnswers) {
  const Problem p =
      paged({.batch = 2, .heads = 2, .seq = 16, .kv_seq = 64, .head_dim = 32}, 16, MaskKind::CausalBottomRight);
  Inputs in = make_inputs(p, 3, cpu_allocator());
  auto* ids = in.block_table.data_as<std::int32_t>();
  // Still a valid table, but the two sequences trade their first pages.
  // (Pages traded within one sequence under no mask would only permute its
  // keys, which attention does not see.)
  std::swap(ids[0], ids[4]);
  check_block_table(p, in.block_table, in.k_pages.size(0));
  for (const char* name : kBackends) {
    SCOPED_TRACE(name);
    Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, cpu_allocator());
    RunContext ctx{cpu_allocator(), nullptr, 1};
    backend(name).forward(p, in, out, ctx);
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    EXPECT_GT(e.rel, 1e-2) << "a swapped table went unnoticed";
  }
}

std::string refusal(const Problem& p, const Tensor& table, std::int64_t num_pages) {
  try {
    check_block_table(p, table, num_pages);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "the table was accepted";
  return {};
}

TEST(PagedInputs, ACorruptTableIsRefusedWithOneLine) {
  const Problem p = paged({.batch = 2, .heads = 2, .seq = 8, .kv_seq = 40, .head_dim = 8}, 16, MaskKind::Causal);
  const Inputs in = make_inputs(p, 11, cpu_allocator());
  const std::int64_t pages = in.k_pages.size(0);
  ASSERT_EQ(pages, 6);
  check_block_table(p, in.block_table, pages);  // the one make_inputs built is fine

  Tensor shared = Tensor::empty(in.block_table.sizes(), DType::I32, cpu_allocator());
  std::copy_n(in.block_table.data_as<std::int32_t>(), 6, shared.data_as<std::int32_t>());
  shared.data_as<std::int32_t>()[3] = shared.data_as<std::int32_t>()[0];  // sequence 1 borrows sequence 0's page
  std::string why = refusal(p, shared, pages);
  EXPECT_NE(why.find("block table [1][0]"), std::string::npos) << why;
  EXPECT_NE(why.find("already sequence 0's logical page 0"), std::string::npos) << why;

  for (const std::int32_t bad : {6, -1, 1000}) {
    Tensor out_of_range = Tensor::empty(in.block_table.sizes(), DType::I32, cpu_allocator());
    std::copy_n(in.block_table.data_as<std::int32_t>(), 6, out_of_range.data_as<std::int32_t>());
    out_of_range.data_as<std::int32_t>()[4] = bad;
    why = refusal(p, out_of_range, pages);
    EXPECT_NE(why.find("block table [1][1] = " + std::to_string(bad) + " is not a physical page"), std::string::npos)
        << why;
  }

  Tensor wrong_shape = Tensor::empty({1, 1, 2, 2}, DType::I32, cpu_allocator());
  why = refusal(p, wrong_shape, pages);
  EXPECT_NE(why.find("want int32 [2, 3]"), std::string::npos) << why;
}

// The backends guard their reads too: a table pointing past the cache is
// refused with one line before any page is read.
TEST(PagedInputs, BackendsRefuseATableOutOfRange) {
  const Problem p = paged({.batch = 2, .heads = 2, .seq = 8, .kv_seq = 40, .head_dim = 8}, 16, MaskKind::Causal);
  Inputs in = make_inputs(p, 5, cpu_allocator());
  in.block_table.data_as<std::int32_t>()[5] = 99;
  for (const char* name : kBackends) {
    SCOPED_TRACE(name);
    Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, cpu_allocator());
    RunContext ctx{cpu_allocator(), nullptr, 1};
    try {
      backend(name).forward(p, in, out, ctx);
      ADD_FAILURE() << "read through a table entry past the cache";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("block table [1][2] = 99 is not a physical page"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(PagedProblem, ValidateSaysWhatToChange) {
  const auto why = [](KvCache c, std::int64_t page, Pass pass = Pass::Forward) {
    Problem p = testing::to_problem(testing::Shape{.seq = 64}, DType::BF16, MaskKind::Causal);
    p.kv_cache = c;
    p.page_size = page;
    p.pass = pass;
    try {
      p.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(why(KvCache::Paged, 16), "");
  EXPECT_EQ(why(KvCache::Paged, 1), "");
  EXPECT_EQ(why(KvCache::Paged, 4096), "") << "a page larger than the cache is one padded page";
  EXPECT_NE(why(KvCache::Paged, 0).find("needs page_size=N"), std::string::npos);
  EXPECT_NE(why(KvCache::Paged, 24).find("power of two"), std::string::npos);
  EXPECT_NE(why(KvCache::Paged, std::int64_t{1} << 23).find("beyond"), std::string::npos);
  EXPECT_NE(why(KvCache::Contiguous, 16).find("only to kv_cache=paged"), std::string::npos);
  EXPECT_NE(why(KvCache::Paged, 16, Pass::Backward).find("forward only"), std::string::npos);
  EXPECT_NE(why(KvCache::Paged, 16, Pass::Train).find("forward only"), std::string::npos);
  EXPECT_EQ(parse_kv_cache("paged"), KvCache::Paged);
  EXPECT_EQ(parse_kv_cache("contiguous"), KvCache::Contiguous);
  EXPECT_FALSE(parse_kv_cache("pages"));
  EXPECT_EQ(kv_cache_name(KvCache::Paged), "paged");
}

TEST(PagedExpectation, NaiveAndMathListTheGathers) {
  const Problem p =
      paged({.batch = 1, .heads = 2, .seq = 16, .kv_seq = 300, .head_dim = 32}, 16, MaskKind::CausalBottomRight);
  EXPECT_EQ(
      backend("naive").expectation(p).cpu_ops,
      (std::vector<std::string>{"index_select", "index_select", "matmul", "mul", "masked_fill", "softmax", "matmul"}));
  EXPECT_EQ(
      backend("naive_inplace").expectation(p).cpu_ops,
      (std::vector<std::string>{"index_select", "index_select", "matmul", "mul", "masked_fill_", "softmax", "matmul"}));
  const auto math = backend("math").expectation(p).cpu_ops;
  ASSERT_GE(math.size(), 2u);
  EXPECT_EQ(math[0], "index_select");
  EXPECT_EQ(math[1], "index_select");
  EXPECT_EQ(std::count(math.begin(), math.end(), "index_select"), 2);
  // The composites' workspace estimate covers the gathered copies.
  const auto* naive = dynamic_cast<const composite::CompositeBackend*>(&backend("naive"));
  ASSERT_NE(naive, nullptr);
  EXPECT_LE(naive->planned_workspace_bytes(p), naive->workspace_bytes(p));
  // The trace shows them too.
  const RunResult r = run_backend(backend("naive"), p, quick());
  ASSERT_FALSE(r.failure) << *r.failure;
  EXPECT_TRUE(r.acceptance && r.acceptance->pass);
}

// The composites written for CUDA gather the pages too (one kernel each):
// eligible for a paged forward, with two more index_select ops and two more
// kernels than the contiguous forward; a backward through the cache is
// refused with one line. The plan stands in for the CUDA ops.
TEST(PagedEligibility, CudaCompositesGatherThePages) {
  Problem p = paged({.batch = 1, .heads = 2, .seq = 16, .kv_seq = 64, .head_dim = 32}, 16, MaskKind::Causal);
  p.device = Device::Cuda;
  Problem contiguous = p;
  contiguous.kv_cache = KvCache::Contiguous;
  contiguous.page_size = 0;
  const std::unique_ptr<Backend> all[] = {
      composite::make_naive(std::make_unique<composite::PlanOps>(Device::Cuda)),
      composite::make_naive_inplace(std::make_unique<composite::PlanOps>(Device::Cuda)),
      composite::make_math(std::make_unique<composite::PlanOps>(Device::Cuda))};
  for (const auto& b : all) {
    SCOPED_TRACE(std::string(b->name()));
    const Eligibility el = eligibility_of(*b, p);
    EXPECT_TRUE(el.eligible) << el.reason;
    EXPECT_NE(el.reason.find("gathered from 16-key pages through the block table (index_select, one kernel each)"),
              std::string::npos)
        << el.reason;
    const Expectation paged_e = b->expectation(p), contiguous_e = b->expectation(contiguous);
    ASSERT_GE(paged_e.cpu_ops.size(), 2u);
    EXPECT_EQ(paged_e.cpu_ops[0], "index_select");
    EXPECT_EQ(paged_e.cpu_ops[1], "index_select");
    EXPECT_EQ(std::vector<std::string>(paged_e.cpu_ops.begin() + 2, paged_e.cpu_ops.end()), contiguous_e.cpu_ops);
    EXPECT_EQ(paged_e.device_activities, contiguous_e.device_activities + 2);
    EXPECT_EQ(paged_e.copies, contiguous_e.copies);

    Problem backward = p;
    backward.pass = Pass::Backward;
    const Eligibility refused = b->eligibility(backward);
    EXPECT_FALSE(refused.eligible);
    EXPECT_NE(refused.reason.find("forward only"), std::string::npos) << refused.reason;
    EXPECT_EQ(refused.reason.find('\n'), std::string::npos) << refused.reason;
  }
  // explain() on cuda gives every backend a reason, eligible or not.
  for (const Explanation& e : explain(p)) EXPECT_FALSE(e.reason.empty()) << e.backend;
}

TEST(PagedReport, ProblemJsonNamesTheCache) {
  Problem p = paged({.batch = 1, .heads = 2, .seq = 16, .kv_seq = 64, .head_dim = 32}, 16, MaskKind::Causal);
  EXPECT_EQ(report::problem_json(p)["kv_cache"], "paged");
  EXPECT_EQ(report::problem_json(p)["page_size"], 16);
  p.kv_cache = KvCache::Contiguous;
  p.page_size = 0;
  EXPECT_EQ(report::problem_json(p)["kv_cache"], "contiguous");
  EXPECT_TRUE(report::problem_json(p)["page_size"].is_null());
}

TEST(PagedRing, GpusRefuseAPagedCache) {
  Problem p = paged({.batch = 1, .heads = 2, .seq = 64, .kv_seq = 64, .head_dim = 64}, 16, MaskKind::Causal);
  p.device = Device::Cuda;
  try {
    parallel::check_ring_problem(p, 2);
    ADD_FAILURE() << "a paged ring run was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use kv_cache=contiguous"), std::string::npos) << e.what();
  }
}

// ---- the CLI ------------------------------------------------------------

using testing::CliRun;

CliRun attnprof(const std::vector<std::string>& args) {
  const testing::TempDir io("attnprof_paged");
  return testing::run_cli(args, io.path());
}

void expect_refused(const std::vector<std::string>& extra, const std::string& needle) {
  std::vector<std::string> args = {"explain", "--device", "cpu", "--seq", "64", "--batch", "1", "--heads", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  testing::expect_refused(attnprof(args), needle, 2);
}

TEST(PagedCli, RefusesBadPageFlags) {
  expect_refused({"--kv-cache", "paged", "--page-size", "0"}, "--page-size must be positive");
  expect_refused({"--kv-cache", "paged", "--page-size", "24"}, "--page-size 24 must be a power of two");
  expect_refused({"--page-size", "16"}, "--page-size applies only to --kv-cache paged");
  expect_refused({"--kv-cache", "paged"}, "--kv-cache paged needs --page-size");
  expect_refused({"--kv-cache", "blocks"}, "unknown --kv-cache 'blocks'");
  expect_refused({"--kv-cache", "paged", "--page-size", "16", "--pass", "backward"}, "forward only");
}

TEST(PagedCli, ExplainOnTheCpu) {
  const CliRun r = attnprof({"explain", "--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "16", "--kv-seq",
                             "300", "--mask", "causal-bottom-right", "--kv-cache", "paged", "--page-size", "16"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("paged KV cache"), std::string::npos) << r.out;
  std::istringstream is(r.out);
  int gathering = 0;
  for (std::string l; std::getline(is, l);) {
    if (l.find("not eligible") != std::string::npos) continue;
    if (l.find("gathered from 16-key pages") != std::string::npos) ++gathering;
  }
  EXPECT_EQ(gathering, 3) << r.out;
  EXPECT_NE(r.out.find("read from their pages"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not eligible on CPU"), std::string::npos) << r.out;
}

TEST(PagedCli, HelpNamesTheFlags) {
  const CliRun r = attnprof({"explain", "--help"});
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* w : {"--kv-cache", "--page-size", "power of two"}) {
    EXPECT_NE(r.out.find(w), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace attnprof
