// Soft-capping on CUDA (issue 22 item 3): flash's sm90 kernels take a cap
// (tests/gpu/flash_sequences_test.cpp checks the numbers); every CUDA
// backend whose traits lack one refuses it by name, in one line, forward and
// backward, before any device call (eligibility_of reads the traits), and
// explain() names the backends that take it. The CPU
// backends take it too (tests/cpu/softcap_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/runner.h"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof {
namespace {

Problem capped_cuda_problem(Pass pass) {
  Problem p{.batch = 1,
            .heads = 8,
            .kv_heads = 2,
            .seq = 256,
            .head_dim = 64,
            .dtype = DType::BF16,
            .device = Device::Cuda,
            .mask = MaskKind::Causal};
  p.softcap = 30;
  p.pass = pass;
  p.normalize();
  p.validate();
  return p;
}

TEST(SoftcapCuda, BackendsWithoutItRefuseItByNameAndFlashTakesIt) {
  for (const Pass pass : {Pass::Forward, Pass::Backward, Pass::Train}) {
    const Problem p = capped_cuda_problem(pass);
    for (const std::string_view name : backend_names()) {
      SCOPED_TRACE(std::string(name) + " " + std::string(pass_name(pass)));
      Backend* b = find_backend(name, Device::Cuda);
      ASSERT_NE(b, nullptr) << "a CUDA build has every backend on CUDA";
      if (pass != Pass::Forward && !b->has_backward()) continue;  // refused as having no backward first
      const Eligibility el = eligibility_of(*b, p);
      if (name == "flash") {
        EXPECT_TRUE(b->traits().softcap);
        EXPECT_EQ(el.eligible, cuda::flash_sm90_runs_here()) << el.reason;
      }
      if (b->traits().softcap) continue;
      EXPECT_FALSE(el.eligible);
      EXPECT_EQ(el.reason, "soft-capping is not built for " + std::string(name) + " on cuda yet");
      Problem uncapped = p;
      uncapped.softcap = 0;
      EXPECT_EQ(eligibility_of(*b, uncapped).reason.find("soft-capping"), std::string::npos)
          << "without a cap the backend answers for itself";
    }
  }
}

// The CUDA backends that take soft caps, packed batches and fp8 inputs are
// those whose traits say so; the refusals (no_softcap, no_varlen, no_fp8)
// say why and name none of them: explain() appends the takers.
TEST(SoftcapCuda, TraitsNameTheCudaBackendsThatTakeItAndRefusalsNameNone) {
  std::vector<std::string> softcap, varlen, fp8;
  for (const std::string_view name : backend_names()) {
    const Backend* b = find_backend(name, Device::Cuda);
    ASSERT_NE(b, nullptr) << "a CUDA build has every backend on CUDA";
    if (b->traits().softcap) softcap.emplace_back(name);
    if (b->traits().varlen) varlen.emplace_back(name);
    if (b->traits().fp8) fp8.emplace_back(name);
  }
  for (auto* list : {&softcap, &varlen, &fp8}) std::sort(list->begin(), list->end());
  const std::vector<std::string> named = {"cudnn", "flash", "math", "naive", "naive_inplace"};  // sorted
  EXPECT_EQ(softcap, named);
  EXPECT_EQ(varlen, named);
  EXPECT_EQ(fp8, named);
  EXPECT_EQ(no_softcap("x", Device::Cuda).reason, "soft-capping is not built for x on cuda yet");
  EXPECT_EQ(no_fp8("efficient", Device::Cuda).reason, "fp8 (e4m3) inputs are not built for efficient on cuda");
}

TEST(SoftcapCuda, ExplainAndResolveRefuseInOneLine) {
  const Problem p = capped_cuda_problem(Pass::Forward);
  std::string takers;
  for (const Explanation& e : explain(p)) {
    if (e.eligible) takers += (takers.empty() ? "" : ", ") + e.backend;
  }
  const std::string tail = "; eligible here: " + (takers.empty() ? std::string("none") : takers);
  for (const Explanation& e : explain(p)) {
    const bool takes = find_backend(e.backend, Device::Cuda)->traits().softcap;
    if (!takes) EXPECT_FALSE(e.eligible) << e.backend;
    if (e.eligible) continue;
    EXPECT_EQ(e.reason.substr(e.reason.size() - std::min(e.reason.size(), tail.size())), tail) << e.reason;
    if (takes) continue;
    EXPECT_NE(e.reason.find("soft-capping is not built for " + e.backend + " on cuda yet; eligible here: "),
              std::string::npos)
        << e.reason;
  }
  try {
    resolve_backend(p, "efficient");
    ADD_FAILURE() << "efficient took a soft cap";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("soft-capping is not built for efficient on cuda yet" + tail),
              std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnprof
