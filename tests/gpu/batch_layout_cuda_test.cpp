// Every batch layout on every CUDA backend (eligibility_of with a layout,
// attnprof/backend.h): the composites read pages and packed batches but no
// rows, efficient only dense batches, flash every form. Flash's and
// efficient's own part is asked of the problem and its layout
// (fused_shape_for, fused_shape_unsupported_reason) with no launch
// parameters; its refusals keep the launch check's text.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/batch_layout.h"
#include "attnprof/runner.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

using Form = BatchLayout::Form;

Problem dense(std::int64_t head_dim = 64) {
  Problem p{.batch = 2, .heads = 8, .kv_heads = 2, .seq = 128, .head_dim = head_dim, .dtype = DType::BF16};
  p.device = Device::Cuda;
  p.mask = MaskKind::CausalBottomRight;
  p.normalize();
  p.validate();
  return p;
}

Problem packed() {
  Problem p = varlen_problem(dense(), {100, 128}, {128, 40});
  p.normalize();
  p.validate();
  return p;
}

Problem paged(std::int64_t head_dim = 64) {
  Problem p = dense(head_dim);
  p.seq = 1;
  p.kv_seq = 300;
  p.kv_cache = KvCache::Paged;
  p.page_size = 64;
  p.validate();
  return p;
}

struct FormCase {
  const char* label;
  Problem problem;
  BatchLayout layout;
};

TEST(BatchLayoutCuda, EveryFormOnEveryCudaBackend) {
  REQUIRE_GPU();
  if (!cuda::flash_sm90_runs_here()) GTEST_SKIP() << "the table is an sm90 GPU's (sm_90a code in this build)";
  const std::vector<FormCase> cases = {
      {"dense", dense(), {}},
      {"padded q_rows", dense(), {.form = Form::Padded, .q_rows = true}},
      {"padded kv_rows", dense(), {.form = Form::Padded, .kv_rows = true}},
      {"packed", packed(), {.form = Form::Packed}},
      {"paged", paged(), {.form = Form::Paged}},
      {"paged with seq_lens", paged(), {.form = Form::Paged, .kv_rows = true}},
  };
  const std::string rows = " on cuda reads no per-sequence rows, which layout ";
  const std::string lengths =
      " on cuda takes one kv length for every sequence, and layout paged (seq_lens) gives each its own (or pad the "
      "shorter sequences' pages)";
  const std::string pages =
      "efficient on cuda reads no paged KV cache: use kv_cache=contiguous, or a backend that pages";
  // "" is eligible; otherwise the reason.
  const std::map<std::string, std::vector<std::string>> expected = {
      {"naive",
       {"", "naive" + rows + "padded (q_rows) gives every run", "naive" + rows + "padded (kv_rows) gives every run", "",
        "", "naive" + lengths}},
      {"math",
       {"", "math" + rows + "padded (q_rows) gives every run", "math" + rows + "padded (kv_rows) gives every run", "",
        "", "math" + lengths}},
      {"efficient",
       {"", "efficient" + rows + "padded (q_rows) gives every run",
        "efficient" + rows + "padded (kv_rows) gives every run",
        "packed batches (seq_lens, varlen) are not built for efficient on cuda yet", pages, pages}},
      {"flash", {"", "", "", "", "", ""}},
  };
  for (const auto& [name, answers] : expected) {
    const Backend* b = find_backend(name, Device::Cuda);
    ASSERT_NE(b, nullptr) << name;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(name + " / " + cases[i].label);
      const Eligibility e = eligibility_of(*b, cases[i].problem, cases[i].layout);
      EXPECT_EQ(e.eligible, answers[i].empty()) << e.reason;
      if (!answers[i].empty()) EXPECT_EQ(e.reason, answers[i]);
    }
  }
}

// cuDNN reads a paged cache's key counts but no padded rows (a key-padding
// mask runs there as a bias): eligibility says so, where a launch's bind()
// used to be the first to refuse a padded batch.
TEST(BatchLayoutCuda, CudnnRefusesPaddedRowsByName) {
  REQUIRE_GPU();
  const Backend* cudnn = find_backend("cudnn", Device::Cuda);
  if (cudnn == nullptr) GTEST_SKIP() << "cudnn is not built here";
  for (const BatchLayout& l :
       {BatchLayout{.form = Form::Padded, .q_rows = true}, BatchLayout{.form = Form::Padded, .kv_rows = true}}) {
    const Eligibility e = eligibility_of(*cudnn, dense(), l);
    EXPECT_FALSE(e.eligible);
    EXPECT_EQ(e.reason,
              "cudnn on cuda reads no per-sequence rows, which layout " + layout_text(l) + " gives every run");
  }
  EXPECT_TRUE(cudnn->traits().paged_lengths);
}

// Flash's own refusals, now asked of the problem and its layout, keep the
// launch check's text.
TEST(BatchLayoutCuda, FusedRefusalsKeepTheirText) {
  REQUIRE_GPU();
  const Backend* flash = find_backend("flash", Device::Cuda);
  ASSERT_NE(flash, nullptr);
  Eligibility e = eligibility_of(*flash, dense(40));
  EXPECT_FALSE(e.eligible);
  EXPECT_EQ(e.reason.rfind("head_dim 40 is not built: use one of 32, 64, 96, 128, 256", 0), 0u) << e.reason;
  e = eligibility_of(*flash, paged(96), {.form = Form::Paged});
  EXPECT_FALSE(e.eligible);
  EXPECT_EQ(e.reason, "a paged KV cache is read by the decode kernel, built for head_dim 64, 128, 256, not 96");
}

}  // namespace
}  // namespace attnprof
