// Packed (variable-length) batches on CUDA (issue 22 item 2): flash's sm90
// kernels take them (tests/gpu/flash_sequences_test.cpp checks the numbers);
// every CUDA backend whose traits lack them refuses one by name, in one line,
// forward and backward, before any device call (eligibility_of reads the
// traits). The CPU backends take them too (tests/cpu/varlen_test.cpp).
#include <gtest/gtest.h>

#include <string>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/runner.h"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof {
namespace {

Problem packed_cuda_problem(Pass pass) {
  Problem base{.heads = 8, .kv_heads = 2, .head_dim = 64, .dtype = DType::BF16, .device = Device::Cuda};
  base.mask = MaskKind::Causal;
  base.pass = pass;
  Problem p = varlen_problem(base, {256, 17, 0, 1024}, {256, 40, 3, 1024});
  p.normalize();
  p.validate();
  return p;
}

TEST(VarlenCuda, BackendsWithoutItRefuseItByNameAndFlashTakesIt) {
  for (const Pass pass : {Pass::Forward, Pass::Backward, Pass::Train}) {
    const Problem p = packed_cuda_problem(pass);
    for (const std::string_view name : backend_names()) {
      SCOPED_TRACE(std::string(name) + " " + std::string(pass_name(pass)));
      Backend* b = find_backend(name, Device::Cuda);
      ASSERT_NE(b, nullptr) << "a CUDA build has every backend on CUDA";
      if (pass != Pass::Forward && !b->has_backward()) continue;  // refused as having no backward first
      const Eligibility el = eligibility_of(*b, p);
      if (name == "flash") {
        EXPECT_TRUE(b->traits().varlen);
        EXPECT_EQ(el.eligible, cuda::flash_sm90_runs_here()) << el.reason;
      }
      if (b->traits().varlen) continue;
      EXPECT_FALSE(el.eligible);
      EXPECT_EQ(el.reason, "packed batches (seq_lens, varlen) are not built for " + std::string(name) + " on cuda yet");
      EXPECT_EQ(eligibility_of(*b, p.sequence(0)).reason.find("packed"), std::string::npos)
          << "one sequence alone is dense: the backend answers for itself";
    }
  }
}

TEST(VarlenCuda, ExplainAndResolveRefuseInOneLine) {
  const Problem p = packed_cuda_problem(Pass::Forward);
  for (const Explanation& e : explain(p)) {
    if (find_backend(e.backend, Device::Cuda)->traits().varlen) continue;
    EXPECT_FALSE(e.eligible) << e.backend;
    EXPECT_NE(e.reason.find("not built for " + e.backend), std::string::npos) << e.reason;
  }
  try {
    resolve_backend(p, "efficient");
    ADD_FAILURE() << "efficient took a packed batch";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("packed batches (seq_lens, varlen) are not built for efficient on cuda yet"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnprof
